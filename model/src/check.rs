//! Running the checker and reporting what it found.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::{Action, Config, QueueModel, Rule};

/// What one run of the checker found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The configuration's name.
    pub config: &'static str,
    /// The rule checked.
    pub rule: Rule,
    /// States the checker evaluated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// Wall-clock time of the run.
    pub elapsed: Duration,
    /// Whether the whole state space was explored (false when the run
    /// stopped at the first violation it was looking for).
    pub exhaustive: bool,
    /// `always` and `eventually` properties violated, each with the actions
    /// of a counterexample from the initial state.
    pub violated: Vec<(&'static str, Vec<Action>)>,
    /// `sometimes` properties reached.
    pub reached: BTreeSet<&'static str>,
}

impl Report {
    /// Whether `property` was found violated.
    pub fn violates(&self, property: &str) -> bool {
        self.violated.iter().any(|(name, _)| *name == property)
    }

    /// The names of the properties violated.
    pub fn violated_names(&self) -> Vec<&'static str> {
        self.violated.iter().map(|(name, _)| *name).collect()
    }
}

impl QueueModel {
    /// Explores every reachable state (breadth first, one thread).
    pub fn check(self) -> Report {
        self.run(HasDiscoveries::All)
    }

    /// Explores breadth first until `property` is found violated (or every
    /// state was explored without it).
    pub fn find(self, property: &'static str) -> Report {
        self.run(HasDiscoveries::AnyOf(BTreeSet::from([property])))
    }

    fn run(self, finish_when: HasDiscoveries) -> Report {
        let (config, rule) = (self.config.name, self.rule);
        let properties = self.properties();
        let started = Instant::now();
        let checker = self.checker().finish_when(finish_when.clone()).spawn_bfs().join();
        let elapsed = started.elapsed();
        let discoveries = checker.discoveries();
        let mut violated = Vec::new();
        let mut reached = BTreeSet::new();
        for property in &properties {
            let Some(path) = discoveries.get(property.name) else {
                continue;
            };
            match property.expectation {
                Expectation::Sometimes => {
                    reached.insert(property.name);
                }
                Expectation::Always | Expectation::Eventually => {
                    violated.push((property.name, path.clone().into_actions()));
                }
            }
        }
        // A run stops early only when what it was told to find was found.
        let found: BTreeSet<&'static str> = discoveries.keys().copied().collect();
        let exhaustive = !finish_when.matches(&found, &properties);
        Report {
            config,
            rule,
            states: checker.state_count(),
            unique_states: checker.unique_state_count(),
            max_depth: checker.max_depth(),
            elapsed,
            exhaustive,
            violated,
            reached,
        }
    }
}

/// Checks `config` under the sound rule.
pub fn check(config: Config) -> Report {
    QueueModel::new(config, Rule::Sound).check()
}
