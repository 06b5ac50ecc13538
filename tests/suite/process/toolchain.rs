//! The toolchain promise stays true: the workspace's `rust-version` is the highest
//! `rust-version` any locked dependency declares, neither lower (a broken promise) nor higher.

use std::process::Command;

/// A `rust-version` as comparable numbers: `1.94` and `1.94.0` are the same.
fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|part| part.parse().expect("a numeric rust-version"))
        .collect();
    while parts.len() < 3 {
        parts.push(0);
    }
    parts
}

/// The triple `rustc` builds for by default (`host: ...` in `rustc -vV`).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let output = Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names its host")
        .trim()
        .to_owned()
}

#[test]
fn rust_version_is_the_highest_any_locked_dependency_needs() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // The host's dependencies: a fresh checkout has downloaded only those, and other
    // platforms' crates are not needed to build here.
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host_triple()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|id| id.as_str())
        .collect();
    let mut promised = Vec::new();
    let mut needed: Option<(Vec<u64>, String)> = None;
    for package in metadata["packages"].as_array().expect("packages") {
        let Some(rust_version) = package["rust_version"].as_str() else {
            continue;
        };
        let name = format!("{} {}", package["name"], package["version"]);
        if members.contains(&package["id"].as_str().unwrap_or_default()) {
            promised.push((version(rust_version), name));
        } else if needed
            .as_ref()
            .is_none_or(|(highest, _)| version(rust_version) > *highest)
        {
            needed = Some((version(rust_version), name));
        }
    }
    let (needed, needed_by) = needed.expect("some dependency declares a rust-version");
    assert!(
        !promised.is_empty(),
        "the workspace declares a rust-version"
    );
    for (declared, member) in promised {
        assert_eq!(
            declared, needed,
            "{member} declares rust-version {declared:?}, but {needed_by} needs {needed:?}: \
             set [workspace.package] rust-version in Cargo.toml (and the README) to match"
        );
    }
}
