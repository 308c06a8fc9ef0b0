//! Prints a shortest counterexample, step by step with the queue and the
//! clients after each step:
//!
//! ```text
//! cargo run -p lockline-model --example trace -- <config> <rule> <property>
//! ```
//!
//! `<config>` is a configuration's name (or a unique part of it), `<rule>`
//! a [`Rule`] variant's name, `<property>` a unique part of a property's
//! name. Explores breadth first until the property fails.

use std::collections::BTreeSet;

use lockline_model::state::{Phase, State};
use lockline_model::{Config, QueueModel, Rule};
use stateright::{Checker, HasDiscoveries, Model};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, rule, property] = args.as_slice() else {
        eprintln!("usage: trace <config> <rule> <property>");
        std::process::exit(2);
    };
    let config = Config::all()
        .into_iter()
        .find(|c| c.name.contains(config.as_str()))
        .expect("no such configuration");
    let rule = [Rule::Sound]
        .into_iter()
        .chain(Rule::BROKEN)
        .find(|r| format!("{r:?}") == *rule)
        .expect("no such rule");
    let model = QueueModel::new(config, rule);
    let names: Vec<&'static str> = model.properties().iter().map(|p| p.name).collect();
    let name = names
        .iter()
        .find(|n| **n == property.as_str())
        .or_else(|| names.iter().find(|n| n.contains(property.as_str())))
        .copied()
        .expect("no such property");
    let checker = model
        .clone()
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])))
        .spawn_bfs()
        .join();
    let Some(path) = checker.discovery(name) else {
        println!("`{name}` holds ({} states)", checker.unique_state_count());
        return;
    };
    println!("{} under {rule:?}: `{name}` fails", model.config.name);
    for (step, (state, action)) in path.into_vec().into_iter().enumerate() {
        print_state(&model, &state);
        if let Some(action) = action {
            println!("{step:>2}. {action:?}");
        }
    }
}

fn print_state(model: &QueueModel, state: &State) {
    for (r, res) in state.resources.iter().enumerate() {
        let entries: Vec<String> = res
            .entries
            .iter()
            .map(|e| {
                let mut text = format!("#{} c{} {}", e.id, e.owner, e.mode);
                if e.granted {
                    text.push_str(&format!(" token {}", e.token));
                } else {
                    text.push_str(" waiting");
                }
                if let Some(to) = e.converting {
                    text.push_str(&format!("→{to} since {}", e.since));
                }
                text
            })
            .collect();
        let block = match res.block {
            0 => String::new(),
            id => format!(", value block names #{id}"),
        };
        println!("      r{r}: [{}]{block}", entries.join(", "));
    }
    for (c, client) in state.clients.iter().enumerate() {
        let phase = match client.phase {
            Phase::Ready => format!("ready at step {}", client.pc),
            Phase::Done => "done".to_string(),
            other => format!("{other:?} (step {})", client.pc),
        };
        let held: Vec<String> = client
            .held
            .iter()
            .flatten()
            .map(|h| format!("#{} {} token {}", h.entry, h.mode, h.token))
            .collect();
        let live = if client.live { "" } else { " (expired)" };
        println!("      c{c}: {phase}, holds [{}]{live}", held.join(", "));
    }
    if !state.wakes.is_empty() {
        println!("      wakes in flight: {:?}", state.wakes);
    }
    let _ = model;
}
