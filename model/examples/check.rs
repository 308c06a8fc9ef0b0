//! Checks every configuration under the sound rule and prints what the
//! checker explored and found: `cargo run -p lockline-model --example check`.

use lockline_model::{check, Config};

fn main() {
    for config in Config::all() {
        let report = check(config);
        println!(
            "{:<24} {:>8} states {:>8} unique  depth {:>3}  {:>8.2?}  violated {:?}  reached {:?}",
            report.config,
            report.states,
            report.unique_states,
            report.max_depth,
            report.elapsed,
            report.violated_names(),
            report.reached,
        );
    }
}
