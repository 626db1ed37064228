//! The crate's floors, as the crate docs draw them (`# Layers` in `src/lib.rs`): a module
//! imports only from its own floor and those below it. This test reads that table and every
//! file under `src/`, and fails when a module names one on a floor above it (through
//! `crate::module` or through one of the root's re-exports, `crate::Name`), unless a comment
//! on that line or the line above says `layers:` and why. Comments and doc comments are not
//! imports: a doc link may point anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's floor: its place in the table, from the ground up.
type Floors = BTreeMap<String, usize>;

/// The floors of the table under `# Layers` in the crate docs (`//!` lines of `lib.rs`):
/// each row's second column names its modules in backticks.
fn floors(lib: &str) -> Floors {
    let mut floors = Floors::new();
    let mut in_layers = false;
    let mut floor = 0;
    for line in lib.lines() {
        let Some(doc) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            in_layers = doc.trim_start_matches('#').trim() == "Layers";
            continue;
        }
        if !in_layers || !doc.starts_with('|') || doc.starts_with("|-") || doc.starts_with("| -") {
            continue;
        }
        let columns: Vec<&str> = doc.split('|').collect();
        let Some(modules) = columns.get(2) else {
            continue;
        };
        let names = backticked(modules);
        if names.is_empty() || names == ["modules"] {
            continue;
        }
        floor += 1;
        for name in names {
            floors.insert(name, floor);
        }
    }
    floors
}

/// The words in backticks in `text`.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Where each name the root re-exports comes from: `pub use breaker::{Scope, ...};` in
/// `lib.rs` maps `Scope` to `breaker`.
fn re_exports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let code = strip_comments(lib);
    let mut rest = code.as_str();
    while let Some(start) = rest.find("pub use ") {
        rest = &rest[start + "pub use ".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let statement = &rest[..end];
        rest = &rest[end..];
        let module = statement
            .split("::")
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        for item in statement
            .split(['{', '}', ','])
            .skip(if statement.contains('{') { 1 } else { 0 })
        {
            // `a::b::Name`, `Name`, or `Name as Other`: the name the root gives it.
            let item = item.trim();
            let name = item
                .rsplit(" as ")
                .next()
                .unwrap_or(item)
                .rsplit("::")
                .next()
                .unwrap_or(item)
                .trim();
            if !name.is_empty() && name != "self" {
                names.insert(name.to_owned(), module.clone());
            }
        }
    }
    names
}

/// `text` with every comment taken out, its lines kept, and string and char literals left
/// alone (so that `"smtp://host"` is not taken for a comment, nor `r#"/*"#` for one's start).
fn strip_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let word_before = |i: usize| i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i - 1] == '*' && chars[i] == '/') {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
        } else if c == 'r' && !word_before(i) && matches!(next, Some('"' | '#')) {
            // A raw string: `r"..."`, `r#"..."#`, to the quote and as many hashes.
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let start = i;
            i += hashes + 2;
            while i < chars.len() {
                let closes = chars[i] == '"'
                    && i + hashes < chars.len()
                    && chars[i + 1..=i + hashes].iter().all(|&c| c == '#');
                i += if closes { 1 + hashes } else { 1 };
                if closes {
                    break;
                }
            }
            out.extend(&chars[start..i]);
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.extend(&chars[start..i]);
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal (`'"'`, `'\''`); a lifetime (`'a`) is left to the loop.
            let start = i;
            i += if next == Some('\\') { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            i = i.min(chars.len());
            out.extend(&chars[start..i]);
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// What a file names of the crate: for each `crate::` path, its line (from 1) and the
/// first segment of each path it names (`crate::{a::B, C}` names `a` and `C`).
fn names(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(start) = code[at..].find("crate::") {
        let start = at + start;
        at = start + "crate::".len();
        // `$crate::` in a macro, or a word ending in `crate` (`mail_breaker_crate::`).
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c == '$' || c == '_' || c.is_alphanumeric()) {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let rest = &code[at..];
        if rest.starts_with('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in rest.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        if depth == 1 {
                            continue;
                        }
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            items.push(std::mem::take(&mut item));
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 {
                    item.push(c);
                }
            }
            for item in items {
                let first = first_segment(item.trim());
                if !first.is_empty() && first != "self" {
                    found.push((line, first));
                }
            }
        } else {
            let first = first_segment(rest);
            if !first.is_empty() {
                found.push((line, first));
            }
        }
    }
    found
}

/// The identifier `path` starts with.
fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The top module a file of `src/` belongs to: `src/store/redis/mod.rs` to `store`,
/// `src/pool.rs` to `pool`, `src/bin/...` and `src/main.rs` to `bin`; `lib.rs` to none.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" => None,
        "main.rs" => Some("bin".to_owned()),
        _ => Some(first.trim_end_matches(".rs").to_owned()),
    }
}

/// Whether line `line` (from 1) of `text`, or the line above it, has a comment that says
/// `layers:` and a reason.
fn excused(text: &str, line: usize) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    let said = |index: usize| {
        lines.get(index).is_some_and(|line| {
            line.split_once("//").is_some_and(|(_, comment)| {
                comment
                    .split_once("layers:")
                    .is_some_and(|(_, reason)| reason.trim().len() >= 10)
            })
        })
    };
    said(line - 1) || (line >= 2 && said(line - 2))
}

/// Every import that goes up a floor, and every module that stands on none, as sentences.
fn violations(lib: &str, files: &[(PathBuf, String)]) -> Vec<String> {
    let floors = floors(lib);
    let re_exports = re_exports(lib);
    let mut problems = BTreeSet::new();
    for (relative, text) in files {
        let Some(module) = module_of(relative) else {
            continue;
        };
        let Some(&floor) = floors.get(&module) else {
            problems.insert(format!(
                "module `{module}` (src/{}) stands on no floor: add it to the table under \
                 `# Layers` in src/lib.rs",
                relative.display()
            ));
            continue;
        };
        for (line, name) in names(&strip_comments(text)) {
            let target = if floors.contains_key(&name) {
                name.clone()
            } else if let Some(module) = re_exports.get(&name) {
                module.clone()
            } else {
                continue;
            };
            let Some(&target_floor) = floors.get(&target) else {
                continue;
            };
            if target_floor > floor && !excused(text, line) {
                problems.insert(format!(
                    "src/{}:{line}: `{module}` (floor {floor}) imports `crate::{name}` of \
                     `{target}` (floor {target_floor}), a floor above it; move what it needs \
                     down, or say why on that line with a `// layers: ...` comment",
                    relative.display()
                ));
            }
        }
    }
    problems.into_iter().collect()
}

/// Every `.rs` file under `dir`, by its path relative to `root`.
fn read_tree(root: &Path, dir: &Path, files: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(root, &path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
            let relative = path.strip_prefix(root).expect("under src").to_path_buf();
            files.push((relative, text));
        }
    }
}

/// The crate's `src/`: `lib.rs` and every file.
fn crate_source() -> (String, Vec<(PathBuf, String)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("reading src/lib.rs");
    let mut files = Vec::new();
    read_tree(&src, &src, &mut files);
    (lib, files)
}

#[test]
fn no_module_of_src_imports_one_on_a_floor_above_it() {
    let (lib, files) = crate_source();
    let problems = violations(&lib, &files);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_metrics_module_holds_the_names_and_the_describe_call_only() {
    // Each room records its own metrics through the facade; the ground floor only names
    // them, so it needs nothing from the rooms that record.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let metrics = std::fs::read_to_string(src.join("metrics.rs")).expect("reading src/metrics.rs");
    let code = strip_comments(&metrics);
    let crate_paths: Vec<&str> = code
        .lines()
        .filter(|line| line.contains("crate::"))
        .collect();
    assert!(
        crate_paths.is_empty(),
        "src/metrics.rs uses the crate: {crate_paths:?}"
    );
    let functions: Vec<&str> = code
        .lines()
        .filter(|line| line.contains("fn ") && !line.trim_start().starts_with("///"))
        .collect();
    assert_eq!(
        functions.len(),
        1,
        "src/metrics.rs defines functions beside describe: {functions:?}"
    );
    assert!(functions[0].contains("pub fn describe()"), "{functions:?}");
}

#[test]
fn the_crate_docs_draw_the_floors_from_the_ground_up() {
    let (lib, _) = crate_source();
    let floors = floors(&lib);
    let floor = |module: &str| {
        *floors
            .get(module)
            .unwrap_or_else(|| panic!("`{module}` is on no floor of src/lib.rs's `# Layers`"))
    };
    // The order the crate is built in: each one on a floor above the one before it.
    let order = [
        "machine", "store", "breaker", "pool", "adapters", "outbox", "config", "admin",
    ];
    for pair in order.windows(2) {
        assert!(
            floor(pair[0]) < floor(pair[1]),
            "`{}` should stand below `{}`",
            pair[0],
            pair[1]
        );
    }
    for core in ["transport", "receipt", "error", "time", "metrics"] {
        assert_eq!(
            floor(core),
            floor("machine"),
            "`{core}` is on the ground floor"
        );
    }
    for wrapper in ["retry", "cascade", "rate"] {
        assert_eq!(floor(wrapper), floor("pool"), "`{wrapper}` is a wrapper");
    }
}

/// A small crate of three floors for the checker's own tests.
const LIB: &str = "\
//! # Layers
//! | floor | modules | what |
//! |---|---|---|
//! | 1 | `error`, `machine` | ground |
//! | 2 | `breaker` | shell |
//! | 3 | `config` | top |
//!
//! # Something else
//! | a | `outbox` | b |

pub use error::ConfigError;
pub use config::{Mailer, tree::MailerConfig as Config};
";

fn file(path: &str, text: &str) -> (PathBuf, String) {
    (PathBuf::from(path), text.to_owned())
}

#[test]
fn an_import_of_a_module_on_a_floor_above_is_reported_with_its_line() {
    let files = [file(
        "machine/policy.rs",
        "use std::time::Duration;\nuse crate::config::{at_least_one, non_zero_duration};\n",
    )];
    let problems = violations(LIB, &files);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("src/machine/policy.rs:2: `machine` (floor 1) imports `crate::config`"),
        "{problems:?}"
    );
}

#[test]
fn a_name_the_root_re_exports_counts_as_an_import_of_its_module() {
    let files = [file(
        "breaker/builder.rs",
        "use crate::{\n    ConfigError,\n    Config,\n};\n",
    )];
    let problems = violations(LIB, &files);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("`crate::Config` of `config`"),
        "{problems:?}"
    );
}

#[test]
fn imports_of_the_same_floor_or_below_pass() {
    let files = [
        file(
            "breaker/mod.rs",
            "use crate::machine::State;\nuse crate::{ConfigError, breaker::x};\n",
        ),
        file(
            "config/mod.rs",
            "use crate::{breaker, error::ConfigError};\nfn f() { crate::machine::go(); }\n",
        ),
    ];
    assert_eq!(violations(LIB, &files), Vec::<String>::new());
}

#[test]
fn a_comment_or_a_doc_link_is_not_an_import() {
    let files = [file(
        "machine/mod.rs",
        "//! Built on by [`crate::config`].\n/// See crate::config::Mailer.\nfn f() {} // crate::config\n/* crate::config */\nconst URL: &str = \"smtp://x\"; // crate::config\n",
    )];
    assert_eq!(violations(LIB, &files), Vec::<String>::new());
}

#[test]
fn a_comment_that_names_the_reason_lets_an_import_go_up() {
    let files = [
        file(
            "machine/a.rs",
            "// layers: the policy reads the mailer's defaults, until they move down\nuse crate::config::Defaults;\n",
        ),
        file(
            "machine/b.rs",
            "use crate::config::Defaults; // layers: the same defaults, read once\n",
        ),
    ];
    assert_eq!(violations(LIB, &files), Vec::<String>::new());
}

#[test]
fn a_comment_without_a_reason_does_not() {
    let files = [file(
        "machine/a.rs",
        "use crate::config::Defaults; // layers:\n",
    )];
    assert_eq!(violations(LIB, &files).len(), 1);
}

#[test]
fn a_module_on_no_floor_is_reported() {
    let files = [file("oauth2.rs", "use crate::machine::State;\n")];
    let problems = violations(LIB, &files);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("module `oauth2` (src/oauth2.rs) stands on no floor"));
}

#[test]
fn only_the_table_under_layers_draws_floors() {
    let floors = floors(LIB);
    assert_eq!(floors.get("config"), Some(&3));
    assert_eq!(floors.get("outbox"), None);
}
