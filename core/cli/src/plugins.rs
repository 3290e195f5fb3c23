//! `areal plugins`: every registered plugin, by kind.

/// Print every registered plugin: a table, or JSON.
#[allow(clippy::print_stdout, reason = "the command's output is its stdout")]
pub(crate) fn print(json: bool) {
    let plugins = areal_core::registered_plugins();
    if json {
        let list: Vec<_> = plugins
            .iter()
            .map(|p| serde_json::json!({"kind": p.kind, "name": p.name, "description": p.description}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("plugins serialise")
        );
        return;
    }
    let width = plugins
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:<10} {:<width$} DESCRIPTION", "KIND", "NAME");
    for p in plugins {
        println!("{:<10} {:<width$} {}", p.kind, p.name, p.description);
    }
}
