//! `--help`, `--version` and `completions`: on standard output with status
//! 0, scripts that know the commands, and help that agrees with the docs.

use super::*;

/// `--help` prints the whole help on standard output and exits 0; a
/// command's `--help` (also after its options) prints that command's help,
/// with what applies to it: the server flags, the variables and the exit
/// statuses; `--version` prints the version. A `--help` after the lock name
/// belongs to the command, not to lockline.
#[test]
fn help_and_version_go_to_stdout_with_status_0() {
    // Every command's help tells these.
    let common = [
        "--zookeeper",
        "ZOOKEEPER_CONNECT",
        "--postgres <URL>",
        "--mysql <URL>",
        "DATABASE_URL",
        "sslmode=require",
        "--cacert",
        "--zk-auth",
        "ETCDCTL_ENDPOINTS",
        "Exit statuses",
        "1     check: the sequencer is not current",
        "120   the lock (or leadership) was lost",
        "121   credentials or permission refused",
        "122   cluster unreachable",
        "123   bad arguments",
        "124   --timeout ran out",
        "125   any other lockline failure",
        "126   COMMAND found but could not be run",
        "127   COMMAND not found",
        "128+N",
    ];
    let whole = [
        "usage: lockline lock",
        "lockline elect [OPTIONS] NAME PROPOSAL",
        "lockline elect -l|--listen",
        "lockline list",
        "lockline check [OPTIONS] SEQUENCER",
        "lockline completions",
        "--print-key",
        "--kill-after",
        "LOCKLINE_TOKEN",
        "LOCKLINE_SEQUENCER",
        "--lock-delay <SECS>",
        "--verbose",
        "--listen",
        "lock-delay until TIME",
        "-s, --shared",
        "--limit <N>",
        "-n, --nonblock",
        "--conflict-exit-code <STATUS>",
        "--mode <MODE>",
        "lock-MODE",
    ];
    let lock = [
        "usage: lockline lock [-s|--limit N|--mode MODE] [-n] [OPTIONS] NAME",
        "-s, --shared",
        "--limit <N>",
        "--mode <MODE>",
        "[possible values: NL, CR, CW, PR, PW, EX]",
        "lock-PW (say) under --mode PW",
        "-n, --nonblock",
        "--conflict-exit-code <STATUS>",
        "lock -n: NAME is taken",
        "--print-key",
        "--kill-after",
        "--lock-delay <SECS>",
        "LOCKLINE_TOKEN",
        "LOCKLINE_SEQUENCER",
    ];
    let help = |args: &[&str]| {
        let output = lockline(args);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert!(
            output.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 help")
    };
    for (args, parts) in [
        (vec!["--help"], &whole[..]),
        (vec!["-h"], &whole[..]),
        (vec!["help"], &whole[..]),
        (vec!["lock", "--help"], &lock[..]),
        (vec!["help", "lock"], &lock[..]),
        (
            vec!["lock", "--etcd", "http://127.0.0.1:1", "--ttl", "3", "-h"],
            &lock[..],
        ),
    ] {
        let stdout = help(&args);
        for part in common.iter().chain(parts) {
            assert!(stdout.contains(part), "{args:?}: no {part:?} in the help");
        }
    }
    let version = lockline(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("lockline {}", env!("CARGO_PKG_VERSION"))
    );
    // The command's own flag: lockline tries to lock (and fails, nothing
    // listens there: 122) instead of printing its help.
    let output = lockline(&[
        "lock",
        "--etcd",
        "http://127.0.0.1:1",
        "--timeout",
        "1",
        "x",
        "ls",
        "--help",
    ]);
    assert_eq!(output.status.code(), Some(122));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("usage:"));
    for (args, says) in [
        (vec!["elect", "--help"], "usage: lockline elect [OPTIONS] NAME PROPOSAL"),
        (vec!["list", "-h"], "usage: lockline list [OPTIONS] NAME"),
        (vec!["elect", "-l", "--help"], "lockline elect -l|--listen"),
        (vec!["check", "--help"], "usage: lockline check [OPTIONS] SEQUENCER"),
        (
            vec!["check", "--etcd", "http://127.0.0.1:1", "--verbose", "-h"],
            "usage: lockline check",
        ),
    ] {
        let stdout = help(&args);
        assert!(stdout.contains(says), "{args:?}: {stdout}");
        for part in common {
            assert!(stdout.contains(part), "{args:?}: no {part:?} in the help");
        }
    }
}

/// `lockline completions SHELL` prints a completion script that the shell
/// reads without error and that knows the commands and their flags.
#[test]
fn completions_are_scripts_that_know_the_commands() {
    let script = |shell: &str| {
        let output = lockline(&["completions", shell]);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{shell}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 script")
    };
    let bash = script("bash");
    for word in [
        "lock",
        "elect",
        "list",
        "check",
        "--etcd",
        "--zookeeper",
        "--kill-after",
    ] {
        assert!(bash.contains(word), "bash: no {word}");
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("lockline.bash");
    std::fs::write(&path, &bash).expect("write the script");
    let checked = Command::new("bash").arg("-n").arg(&path).output().expect("run bash -n");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    // Sourced, it completes `lockline l` with the commands that begin so.
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && COMP_WORDS=(lockline l) COMP_CWORD=1 COMP_LINE='lockline l' COMP_POINT=10 && _lockline lockline l lockline && echo \"${{COMPREPLY[@]}}\"",
            path.display()
        ))
        .output()
        .expect("run bash");
    let words = String::from_utf8_lossy(&completed.stdout);
    assert!(
        words.split_whitespace().any(|w| w == "lock") && words.split_whitespace().any(|w| w == "list"),
        "completions of `lockline l`: {words:?} {}",
        String::from_utf8_lossy(&completed.stderr)
    );
    for shell in ["zsh", "fish"] {
        let text = script(shell);
        for word in ["lockline", "elect", "zookeeper"] {
            assert!(text.contains(word), "{shell}: no {word}");
        }
    }
    let zsh = script("zsh");
    assert!(
        zsh.starts_with("#compdef lockline"),
        "zsh: {}",
        &zsh[..zsh.len().min(80)]
    );
    let fish = script("fish");
    assert!(fish.contains("complete -c lockline"), "fish");
    let bad = lockline(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(123));
    // A refusal names what is wrong, on one line: the shells there are, the
    // argument not given.
    for (args, says) in [
        (
            &["completions", "tcsh"][..],
            "[possible values: bash, elvish, fish, powershell, zsh]",
        ),
        (&["completions"][..], "not provided: <SHELL>"),
    ] {
        let stderr = assert_refused_without_secret(args, 123);
        assert!(
            stderr.contains(says) && stderr.trim_end().lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
}

/// `--help`, the program's documentation and the command's chapter of the
/// documentation (`docs/cli.md`, linked from the README) name the same flags,
/// variables and exit statuses.
#[test]
fn the_help_the_docs_and_the_readme_agree() {
    let help = String::from_utf8(lockline(&["--help"]).stdout).expect("UTF-8 help");
    let section = include_str!("../../../docs/cli.md");
    let secure = include_str!("../../../docs/security.md");
    assert!(section.starts_with("# The `lockline` command"), "the command's chapter");
    let docs = include_str!("../../src/lockline.md");
    let words = |text: &str, keep: fn(&str) -> bool| {
        let mut words: Vec<String> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .map(|word| word.trim_end_matches('-').to_owned())
            .filter(|word| keep(word))
            .collect();
        words.sort();
        words.dedup();
        words
    };
    // `--flag` stands for any flag in the help's `--flag=VALUE`.
    let flag = |word: &str| word.starts_with("--") && word.len() > 2 && word != "--flag";
    // The environment's, not an example URL's `VERIFY_IDENTITY`.
    let variable = |word: &str| {
        ["LOCKLINE_", "ETCDCTL_", "ZOOKEEPER_", "DATABASE_"]
            .iter()
            .any(|prefix| word.starts_with(prefix))
    };
    let flags = words(&help, flag);
    assert!(flags.contains(&"--lock-delay".to_owned()), "{flags:?}");
    for flag in &flags {
        assert!(section.contains(flag.as_str()), "{flag} is not in docs/cli.md");
        assert!(docs.contains(flag.as_str()), "{flag} is not in the program's docs");
    }
    for flag in words(section, flag).iter().chain(&words(docs, flag)) {
        // `cargo install --path cli` is cargo's.
        assert!(
            help.contains(flag.as_str()) || flag == "--path",
            "{flag} is documented but not in --help"
        );
    }
    let variables = words(&help, variable);
    assert!(variables.contains(&"LOCKLINE_SEQUENCER".to_owned()), "{variables:?}");
    for variable in &variables {
        // The command's chapter, or the secure clusters' one (`ETCDCTL_CACERT`, ...).
        assert!(
            section.contains(variable.as_str()) || secure.contains(variable.as_str()),
            "{variable} is not in docs/cli.md or docs/security.md"
        );
        assert!(
            docs.contains(variable.as_str()),
            "{variable} is not in the program's docs"
        );
    }
    let statuses: Vec<&str> = help
        .split_once("Exit statuses:")
        .expect("the statuses")
        .1
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|status| status.parse::<u8>().is_ok())
        .collect();
    assert!(statuses.contains(&"1") && statuses.contains(&"123"), "{statuses:?}");
    for status in statuses {
        let row = format!("\n| {status} |");
        assert!(section.contains(&row), "status {status} is not in docs/cli.md's table");
        assert!(
            docs.contains(&row),
            "status {status} is not in the program's docs table"
        );
    }
}
