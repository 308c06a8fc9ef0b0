//! Checks every configuration under the sound rule, then each broken twin
//! on the configuration it is shown on, and prints what the checker explored
//! and found:
//!
//! ```text
//! cargo run -p lockline-model --example check            # dev profile (optimised for this crate)
//! cargo run -p lockline-model --example check --release  # release profile
//! ```

use lockline_model::{check, Config, QueueModel, Report, Rule};

fn main() {
    println!("sound rule, every state explored (breadth first, one thread):");
    for config in Config::all() {
        print(&check(config));
    }
    println!();
    println!("broken twins, explored until the property they target fails:");
    for rule in Rule::BROKEN {
        let (Some(config), Some(target)) = (rule.shown_on(), rule.breaks()) else {
            continue;
        };
        let report = QueueModel::new(config, rule).find(target);
        print(&report);
        if let Some((_, path)) = report.violated.iter().find(|(name, _)| *name == target) {
            println!("    `{target}` fails after {} steps", path.len());
        } else {
            println!("    `{target}` HELD: the twin is not caught");
        }
    }
}

fn print(report: &Report) {
    println!(
        "  {:<22} {:<32} {:>8} states {:>7} unique  depth {:>2} {:>9.2?}  violated {:?}",
        report.config,
        format!("{:?}", report.rule),
        report.states,
        report.unique_states,
        report.max_depth,
        report.elapsed,
        report.violated_names(),
    );
}
