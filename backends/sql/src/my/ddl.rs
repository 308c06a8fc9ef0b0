//! The tables and procedures: `ddl/mariadb.sql`, the one source, made for
//! one database and table prefix, and run a step at a time; and the
//! procedures a move from an older layout creates, taken from it.

use super::Names;
use crate::ddl;
use crate::dialect::DbResult;
use crate::layout::DEFAULT_PREFIX;

/// The tables and procedures, as `ddl/mariadb.sql` keeps them: for
/// database [`SCRIPT_DATABASE`] and the default table prefix.
const SCRIPT: &str = include_str!("../../ddl/mariadb.sql");

/// The database the script is written for.
const SCRIPT_DATABASE: &str = "lockline";

impl Names {
    /// The tables and procedures, as a script a DBA can run (the `mariadb`
    /// client needs its `DELIMITER` lines around each procedure, whose body
    /// holds `;`): the script of `ddl/mariadb.sql` for these names.
    pub(super) fn ddl(&self) -> String {
        self.renamed(ddl::without_notes(SCRIPT))
    }

    /// The DDL in the steps a connection runs one after the other: the
    /// tables, the procedures, and the layout's row (last: its row says the
    /// rest exists).
    pub(super) fn ddl_steps(&self) -> Vec<String> {
        script_steps(&self.ddl()).into_iter().map(str::to_owned).collect()
    }

    /// The procedures layout 5 added (the fence of layout 4 with them), one
    /// step each: what a session creates alone when it moves layout 3 or 4
    /// tables to layout 5.
    pub(super) fn upgrade_steps(&self) -> DbResult<Vec<String>> {
        let steps = self.ddl_steps();
        [&self.fence_procedure, &self.wait_turn_procedure, &self.remove_procedure]
            .into_iter()
            .map(|procedure| {
                let create = format!("CREATE PROCEDURE IF NOT EXISTS {procedure}(");
                steps
                    .iter()
                    .find(|step| step.contains(&create))
                    .cloned()
                    .ok_or_else(|| {
                        sqlx::Error::Configuration(format!("the DDL script has no procedure {procedure}").into())
                    })
            })
            .collect()
    }

    /// `text` of the script with its names replaced by these.
    fn renamed(&self, text: &str) -> String {
        let script = Names::lock_prefix(SCRIPT_DATABASE, DEFAULT_PREFIX);
        ddl::rename(
            text,
            &[
                (&format!("`{SCRIPT_DATABASE}`"), &format!("`{}`", self.database)),
                (&format!("`{DEFAULT_PREFIX}"), &format!("`{}", self.prefix)),
                (&script, &self.lock_prefix),
            ],
        )
    }
}

/// The steps of a script that a connection runs one after the other: the
/// text before the first procedure, each procedure (alone between a
/// `DELIMITER //` line and its closing `//`, `DELIMITER ;` lines), and the
/// text after the last one.
fn script_steps<'s>(script: &'s str) -> Vec<&'s str> {
    let mut steps = Vec::new();
    let mut push = |step: &'s str| {
        if !step.is_empty() {
            steps.push(step);
        }
    };
    let (mut start, mut at, mut in_procedure) = (0, 0, false);
    for line in script.split_inclusive('\n') {
        let line_start = at;
        at += line.len();
        match (in_procedure, line.trim_end()) {
            (false, "DELIMITER //") => {
                push(&script[start..line_start]);
                (start, in_procedure) = (at, true);
            }
            (true, "DELIMITER ;") => {
                let procedure = &script[start..line_start];
                push(procedure.strip_suffix("//\n").unwrap_or(procedure));
                (start, in_procedure) = (at, false);
            }
            _ => {}
        }
    }
    push(&script[start..]);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::LAYOUT_VERSION;

    #[test]
    fn the_script_is_of_this_layout() {
        let script = ddl::without_notes(SCRIPT);
        assert!(script.starts_with(&format!(
            "-- lockline's tables and procedures (layout {LAYOUT_VERSION})"
        )));
        assert!(script.ends_with(&format!("(singleton, layout) VALUES (1, {LAYOUT_VERSION});\n")));
    }

    #[test]
    fn every_name_of_the_script_is_replaced() {
        let script = Names::lock_prefix(SCRIPT_DATABASE, DEFAULT_PREFIX);
        ddl::check_renaming(
            SCRIPT,
            &Names::new(SCRIPT_DATABASE, DEFAULT_PREFIX).ddl(),
            &Names::new("app", "p_").ddl(),
            &["`lockline`", "`lockline_", &script],
            &[
                (&format!("`{SCRIPT_DATABASE}`.`{DEFAULT_PREFIX}"), "`app`.`p_"),
                (&script, &Names::lock_prefix("app", "p_")),
            ],
        );
    }

    #[test]
    fn the_script_runs_a_step_at_a_time() {
        let names = Names::new("app", "p_");
        let steps = names.ddl_steps();
        // The tables, one step per procedure, the layout's row.
        let procedures = [
            "append",
            "update_queue",
            "watch",
            "wake",
            "fence",
            "wait_turn",
            "remove",
        ];
        assert_eq!(steps.len(), procedures.len() + 2, "{steps:#?}");
        assert!(steps[0].contains("CREATE TABLE IF NOT EXISTS `app`.`p_entries`"));
        assert!(!steps[0].contains("DELIMITER") && !steps[0].contains("PROCEDURE IF"));
        for (step, procedure) in steps[1..].iter().zip(procedures) {
            assert_eq!(step.matches("CREATE PROCEDURE").count(), 1, "{step}");
            assert!(step.contains(&format!("CREATE PROCEDURE IF NOT EXISTS `app`.`p_{procedure}`(")));
            assert!(step.ends_with("END") && !step.contains("DELIMITER"), "{step}");
        }
        assert!(steps[procedures.len() + 1].contains("INSERT IGNORE INTO `app`.`p_meta`"));
        let moved = names.upgrade_steps().expect("the procedures");
        assert_eq!(moved, [&steps[5], &steps[6], &steps[7]].map(String::clone));
    }
}
