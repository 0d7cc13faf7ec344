//! README's architecture picture stays current: it draws every crate of the workspace (but the
//! test, conformance, demo and benchmark harnesses), and every folder it names exists.

use std::path::Path;

#[test]
fn the_readme_picture_draws_every_crate_and_names_only_folders_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ is in the workspace");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let picture = readme
        .split("```mermaid\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md holds a ```mermaid picture");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .expect("the workspace's members");
    let members: Vec<&str> = members.split('"').skip(1).step_by(2).collect();
    assert!(members.contains(&"mover"), "members parsed: {members:?}");
    for member in members {
        let drawn = match member {
            "e2e" | "conformance" | "demo" | "bench" => continue,
            // The extension: its two roles.
            "." => vec!["src/directory/".to_owned(), "src/shard/".to_owned()],
            other => vec![format!("{other}/")],
        };
        for folder in drawn {
            assert!(
                picture.contains(folder.as_str()),
                "README's picture does not draw {folder} (workspace member {member})"
            );
        }
    }
    // Every path-like word of the picture (ending in '/') is a folder of the repository.
    let text = picture.replace("<br/>", " ");
    let named = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/' || c == '-'))
        .filter(|w| w.ends_with('/') && w.len() > 1 && !w.starts_with('/'));
    for folder in named {
        assert!(
            root.join(folder).is_dir(),
            "README's picture names {folder}, which is not a folder"
        );
    }
}
