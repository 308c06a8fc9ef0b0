//! The README and the chapters under `docs/` as a user meets them: every `rust`
//! block builds in a crate of its own, outside this workspace, whose
//! dependencies are the documentation's own dependency lines (the ```toml
//! blocks and the inline `lockline-… = { git = "…" }` lines); and every link
//! between them leads to a file that exists.
//!
//! The crates are not published, so the dependency lines name this
//! repository with git. The machine that runs the tests may have no network,
//! so the scratch crate patches that git source (`[patch."<url>"]`) with this
//! checkout. Cargo loads a patched git source only to resolve it; the lock
//! file is therefore made first from the same crate with path dependencies
//! (an identical lock: patched and path packages are both path packages; a
//! crate the workspace never downloaded comes from the crates registry), and
//! the build then runs `--offline --locked`: it uses that lock as it is, and
//! would fail rather than fetch anything. The scratch crate lives in the
//! system's temporary directory under a name derived from this checkout, and
//! builds into this workspace's target directory, so a second run rebuilds
//! only what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README and every chapter, as (path relative to the root, text).
fn documents() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_owned()];
    let mut chapters: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").file_name().into_string().expect("UTF-8"))
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    chapters.sort();
    paths.extend(chapters);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(Path::new(ROOT).join(&path)).expect("a document");
            (path, text)
        })
        .collect()
}

/// A fenced block: its info string, the line its fence opens on, its lines.
struct Block {
    info: String,
    line: usize,
    code: Vec<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in text.lines().enumerate() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_owned(),
                    line: index + 1,
                    code: Vec::new(),
                })
            }
            (Some(_), Some(_)) => blocks.push(open.take().expect("an open block")),
            (Some(block), None) => block.code.push(line.to_owned()),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a block left open");
    blocks
}

/// Whether rustdoc would compile the block: a `rust` block (or one with no
/// language, as rustdoc takes it) that is not `ignore` or `compile_fail`.
fn is_compiled_rust(info: &str) -> bool {
    info.split(',')
        .map(str::trim)
        .filter(|word| !word.is_empty())
        .all(|word| matches!(word, "rust" | "no_run" | "should_panic") || word.starts_with("edition"))
}

/// The block's source as rustdoc compiles it: hidden `# ` lines shown, and
/// wrapped in a `fn main` when it has none.
fn program(block: &Block) -> String {
    let lines: Vec<String> = block
        .code
        .iter()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed == "#" {
                String::new()
            } else if let Some(rest) = trimmed.strip_prefix("# ") {
                rest.to_owned()
            } else if let Some(rest) = trimmed.strip_prefix("##") {
                format!("{}#{rest}", &line[..line.len() - trimmed.len()])
            } else {
                line.clone()
            }
        })
        .collect();
    let code = lines.join("\n");
    if code.contains("fn main") {
        code
    } else {
        format!("fn main() {{\n{code}\n}}")
    }
}

/// The dependency lines the documentation gives: `name = spec` from every
/// ```toml block's `[dependencies]` table, and inline `lockline-… = { … }`.
fn dependency_lines(documents: &[(String, String)]) -> Vec<(String, String, String)> {
    let mut lines = Vec::new();
    for (path, text) in documents {
        for block in blocks(text).iter().filter(|block| block.info == "toml") {
            let mut in_dependencies = false;
            for line in &block.code {
                let line = line.split(" #").next().expect("a line").trim();
                if line.starts_with('[') {
                    in_dependencies = line == "[dependencies]";
                } else if let (true, Some((name, spec))) = (in_dependencies, line.split_once(" = ")) {
                    lines.push((path.clone(), name.trim().to_owned(), spec.trim().to_owned()));
                }
            }
        }
        for span in text.split('`').skip(1).step_by(2) {
            if let Some((name, spec)) = span.split_once(" = ") {
                if name.starts_with("lockline") && spec.starts_with('{') {
                    lines.push((path.clone(), name.to_owned(), spec.to_owned()));
                }
            }
        }
    }
    lines
}

/// The workspace's `repository`, which the dependency lines must name.
fn repository() -> String {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let line = manifest
        .lines()
        .find(|line| line.starts_with("repository = \""))
        .expect("the workspace's repository");
    line.trim_start_matches("repository = \"")
        .trim_end_matches('"')
        .to_owned()
}

/// Where a workspace crate's sources are.
fn crate_dir(name: &str) -> PathBuf {
    let dir = match name.strip_prefix("lockline-") {
        None => PathBuf::from(ROOT),
        Some(backend) => Path::new(ROOT).join("backends").join(backend),
    };
    assert!(dir.join("Cargo.toml").exists(), "no crate {name} at {}", dir.display());
    dir
}

/// Writes `contents` to `path` only when it differs, so that cargo sees an
/// unchanged file as unchanged.
fn write(path: &Path, contents: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(contents) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        std::fs::write(path, contents).expect("a write");
    }
}

/// Runs cargo; whether it succeeded, or a panic with its output if `must`.
fn cargo(dir: &Path, target: &Path, args: &[&str], must: bool) -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success() || !must,
        "cargo {args:?} in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.status.success()
}

#[test]
fn every_rust_block_of_the_readme_and_the_chapters_builds_in_a_crate_of_its_own() {
    let started = Instant::now();
    let documents = documents();
    let repository = repository();

    // The dependencies: one line per name (the longest: `features` added),
    // every lockline crate by git from the repository, nothing by version.
    let mut dependencies: BTreeMap<String, String> = BTreeMap::new();
    for (path, name, spec) in dependency_lines(&documents) {
        if name.starts_with("lockline") {
            assert!(
                spec.starts_with(&format!("{{ git = \"{repository}\"")) && !spec.contains("version"),
                "{path}: `{name} = {spec}` does not name the repository by git"
            );
        }
        let kept = dependencies.entry(name).or_default();
        if spec.len() > kept.len() {
            *kept = spec;
        }
    }
    for name in [
        "lockline",
        "lockline-etcd",
        "lockline-zookeeper",
        "lockline-redis",
        "lockline-sql",
        "tokio",
    ] {
        assert!(dependencies.contains_key(name), "no dependency line for {name}");
    }

    // The blocks, one module each.
    let mut modules = Vec::new();
    for (path, text) in &documents {
        for block in blocks(text).iter().filter(|block| is_compiled_rust(&block.info)) {
            let module = format!(
                "{}_{}",
                path.trim_end_matches(".md")
                    .replace(['/', '-', '.'], "_")
                    .to_lowercase(),
                block.line
            );
            let code = program(block);
            for used in code.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if used.starts_with("lockline_") {
                    assert!(
                        dependencies.contains_key(&used.replace('_', "-")),
                        "{path}:{}: uses {used}, which no dependency line gives",
                        block.line
                    );
                }
            }
            modules.push((module, format!("// {path}, line {}\n{code}\n", block.line)));
        }
    }
    assert!(modules.len() >= 10, "only {} rust blocks found", modules.len());

    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ROOT.hash(&mut hasher);
    let scratch = std::env::temp_dir().join(format!("lockline-doc-blocks-{:016x}", hasher.finish()));
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("doc-blocks");
    let lockline_crates: BTreeSet<&String> = dependencies
        .keys()
        .filter(|name| name.starts_with("lockline"))
        .collect();

    let manifest = |dependency: &dyn Fn(&str, &str) -> String, patch: &str| {
        let mut manifest = String::from(
            "[package]\nname = \"doc-blocks\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             # A crate of its own, not a member of any workspace above it.\n[workspace]\n\n\
             [features]\ndefault = [\"metrics\"]\nmetrics = []\n\n[dependencies]\n",
        );
        for (name, spec) in &dependencies {
            manifest += &format!("{name} = {}\n", dependency(name, spec));
        }
        manifest + patch
    };
    let main_rs: String = std::iter::once("#![allow(dead_code, unused)]\n".to_owned())
        .chain(modules.iter().map(|(module, _)| format!("mod {module};\n")))
        .chain(std::iter::once("\nfn main() {}\n".to_owned()))
        .collect();

    // 1. The lock file, from the same crate with path dependencies.
    let resolve = scratch.join("resolve");
    let path_of = |name: &str| format!("{:?}", crate_dir(name).display().to_string());
    write(
        &resolve.join("Cargo.toml"),
        &manifest(
            &|name, spec| {
                if name.starts_with("lockline") {
                    spec.replacen(
                        &format!("git = \"{repository}\""),
                        &format!("path = {}", path_of(name)),
                        1,
                    )
                } else {
                    spec.to_owned()
                }
            },
            "",
        ),
    );
    write(&resolve.join("src/main.rs"), "fn main() {}\n");
    // Start from the workspace's lock, so that the versions are the ones tested.
    let workspace_lock = std::fs::read_to_string(Path::new(ROOT).join("Cargo.lock")).expect("Cargo.lock");
    std::fs::write(resolve.join("Cargo.lock"), &workspace_lock).expect("a lock");
    // What the workspace's build downloaded is usually all it needs; a crate
    // it lacks (a dependency line with other features) comes from the crates
    // registry. This manifest names no git source, so nothing else is asked.
    if !cargo(&resolve, &target, &["fetch", "--offline"], false) {
        std::fs::write(resolve.join("Cargo.lock"), &workspace_lock).expect("a lock");
        cargo(&resolve, &target, &["fetch"], true);
    }
    let lock = std::fs::read_to_string(resolve.join("Cargo.lock")).expect("the lock");

    // 2. The crate as a user writes it: the documentation's git lines, with
    // the git source patched to this checkout, built from that lock alone.
    let build = scratch.join("build");
    let mut patch = format!("\n[patch.\"{repository}\"]\n");
    for name in &lockline_crates {
        patch += &format!("{name} = {{ path = {} }}\n", path_of(name));
    }
    write(&build.join("Cargo.toml"), &manifest(&|_, spec| spec.to_owned(), &patch));
    write(&build.join("Cargo.lock"), &lock);
    write(&build.join("src/main.rs"), &main_rs);
    for (module, code) in &modules {
        write(&build.join("src").join(format!("{module}.rs")), code);
    }
    cargo(&build, &target, &["build", "--offline", "--locked"], true);
    println!(
        "{} blocks built in {} ({:.1} s)",
        modules.len(),
        build.display(),
        started.elapsed().as_secs_f64()
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_block = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block && line.starts_with('#') {
            anchors.insert(anchor(line.trim_start_matches('#')));
        }
    }
    anchors
}

#[test]
fn every_link_between_the_readme_and_the_chapters_leads_somewhere() {
    let repository = repository();
    let blob = format!("{repository}/blob/main/");
    let mut links = 0;
    for (path, text) in documents() {
        let base = Path::new(ROOT).join(&path);
        let base = base.parent().expect("a directory");
        for (_, rest) in text.match_indices("](").map(|(at, _)| ("", &text[at + 2..])) {
            let target = &rest[..rest.find(')').expect("a closed link")];
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target, None),
            };
            let file = if let Some(in_repository) = file.strip_prefix(&blob) {
                Path::new(ROOT).join(in_repository)
            } else if file.contains("://") {
                continue;
            } else if file.is_empty() {
                Path::new(ROOT).join(&path)
            } else {
                base.join(file)
            };
            assert!(file.exists(), "{path}: the link {target} leads nowhere");
            if let Some(fragment) = fragment {
                let linked = std::fs::read_to_string(&file).expect("a linked document");
                assert!(
                    anchors(&linked).contains(fragment),
                    "{path}: the link {target} names no heading there"
                );
            }
            links += 1;
        }
    }
    assert!(links >= 20, "only {links} links found");
}
