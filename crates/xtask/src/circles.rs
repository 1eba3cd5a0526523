//! `cargo xtask circles CRATE_DIR`: which of a crate's modules import each other in a circle.
//!
//! A module is a file under `src/` (a folder's files count as the module the folder is named
//! after; `lib.rs` is the crate root). An edge runs from a module to every module it names as
//! `crate::NAME` (in `use` lists too), outside `#[cfg(test)]` modules and comments. The
//! strongly connected components with more than one module are the circles: every module in
//! one reaches every other. Printed largest first, one line each.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// Why the recipe could not read a crate's sources (xtask is plain `std`: no error crates).
#[derive(Debug)]
pub enum Error {
    /// A folder or file that could not be read, with the path it names.
    Read { path: PathBuf, source: std::io::Error },
    /// An entry of a folder that could not be read (no path to name).
    Entry(std::io::Error),
    /// A source file outside `src/` (cannot happen: the files are found under it).
    Outside(std::path::StripPrefixError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Entry(e) => write!(f, "{e}"),
            Error::Outside(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// The text the recipe prints.
pub fn report(crate_dir: &Path) -> Result<String, Error> {
    let graph = graph(crate_dir)?;
    let mut comps = components(&graph);
    comps.retain(|c| c.len() > 1);
    comps.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    let mut out = format!(
        "{}: {} modules; largest import circle: {} modules\n",
        crate_dir.display(),
        graph.len(),
        comps.first().map_or(1, Vec::len)
    );
    for c in comps {
        out.push_str(&format!("circle of {}: {}\n", c.len(), c.join(" ")));
    }
    Ok(out)
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(crate_dir: &Path) -> Result<Graph, Error> {
    let src = crate_dir.join("src");
    let mut files = Vec::new();
    collect(&src, &mut files)?;
    let mut g: Graph = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).map_err(Error::Outside)?;
        let module = module_of(rel);
        g.entry(module).or_default();
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for f in &files {
        let rel = f.strip_prefix(&src).map_err(Error::Outside)?;
        let module = module_of(rel);
        let text = std::fs::read_to_string(f).map_err(|source| Error::Read { path: f.clone(), source })?;
        for target in references(&production_part(&text)) {
            if target != module && names.contains(&target) {
                g.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    Ok(g)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Read { path: dir.to_path_buf(), source })?;
    for e in entries {
        let path = e.map_err(Error::Entry)?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// `lib.rs` → `lib`, `a.rs` → `a`, `a/b.rs` and `a/mod.rs` → `a`.
fn module_of(rel: &Path) -> String {
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next().unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(&first).to_string()
}

/// The text before a `#[cfg(test)]` module, without line comments.
fn production_part(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod ")) {
            break;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The top-level module names a text reaches as `crate::NAME` or inside `crate::{…}`.
fn references(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // Top-level names of a brace list (nested braces belong to those names).
            let mut depth = 0usize;
            let mut item = String::new();
            for ch in list.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        push_first(&item, &mut out);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        push_first(&item, &mut out);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(ch);
                }
            }
        } else {
            push_first(rest, &mut out);
        }
    }
    out
}

fn push_first(text: &str, out: &mut BTreeSet<String>) {
    let name: String = text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    if !name.is_empty() && name != "self" {
        out.insert(name);
    }
}

/// Strongly connected components: two modules are in one when each reaches the other (by
/// reachability sets; the graphs here have a few dozen modules).
fn components(g: &Graph) -> Vec<Vec<String>> {
    let reach: BTreeMap<&str, BTreeSet<&str>> = g.keys().map(|v| (v.as_str(), reachable(g, v))).collect();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for (v, from_v) in &reach {
        if placed.contains(v) {
            continue;
        }
        let mut comp: Vec<String> = vec![v.to_string()];
        for w in from_v {
            if w != v && reach.get(w).is_some_and(|r| r.contains(v)) {
                comp.push(w.to_string());
            }
        }
        for w in &comp {
            if let Some((k, _)) = reach.get_key_value(w.as_str()) {
                placed.insert(k);
            }
        }
        comp.sort();
        out.push(comp);
    }
    out
}

/// The modules `start` reaches (not itself unless through a circle).
fn reachable<'a>(g: &'a Graph, start: &str) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = g.get(start).into_iter().flatten().map(String::as_str).collect();
    while let Some(v) = todo.pop() {
        if seen.insert(v) {
            todo.extend(g.get(v).into_iter().flatten().map(String::as_str));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read_from_paths_and_use_lists() {
        let text = "use crate::a::X;\nuse crate::{b, c::{D, E}, self};\nfn f() { crate::d::g(); }\n// crate::e\n";
        let got: Vec<String> = references(&production_part(text)).into_iter().collect();
        assert_eq!(got, ["a", "b", "c", "d"]);
    }

    #[test]
    fn test_modules_do_not_count() {
        let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n";
        let got: Vec<String> = references(&production_part(text)).into_iter().collect();
        assert_eq!(got, ["a"]);
    }

    #[test]
    fn circles_are_the_strongly_connected_components() {
        let mut g: Graph = BTreeMap::new();
        for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")] {
            g.entry(a.into()).or_default().insert(b.into());
            g.entry(b.into()).or_default();
        }
        let mut comps: Vec<Vec<String>> = components(&g).into_iter().filter(|c| c.len() > 1).collect();
        comps.sort();
        assert_eq!(comps, [vec!["a", "b", "c"], vec!["d", "e"]]);
    }
}
