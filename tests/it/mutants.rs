//! The planted bugs stay plantable: every scripts/mutants/*.patch applies to the tree as it is (a patch
//! that no longer applies silently stops testing its tests) and is registered in scripts/mutants/run with
//! the tests that must catch it. The mutants themselves are run by hand (`scripts/mutants/run`), not in CI.
use std::path::Path;
use std::process::Command;

#[test]
fn every_planted_bug_applies_and_is_registered() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("scripts/mutants");
    if !dir.is_dir() || !root.join(".git").exists() {
        eprintln!("not a git checkout with scripts/mutants (a packaged crate): nothing to check");
        return;
    }
    let run = std::fs::read_to_string(dir.join("run")).expect("scripts/mutants/run");
    let mut patches: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".patch").map(str::to_owned))
        .collect();
    patches.sort();
    assert!(patches.len() >= 20, "{} patches", patches.len());
    let mut failures = Vec::new();
    for name in &patches {
        if !run.contains(&format!("[{name}]=\"")) {
            failures.push(format!("{name}: no tests registered in scripts/mutants/run"));
        }
        let out = Command::new("git")
            .args(["apply", "--check", &format!("scripts/mutants/{name}.patch")])
            .current_dir(root)
            .output()
            .expect("git runs");
        if !out.status.success() {
            failures.push(format!("{name}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
    }
    assert!(failures.is_empty(), "stale planted bugs:\n{}", failures.join("\n"));
}
