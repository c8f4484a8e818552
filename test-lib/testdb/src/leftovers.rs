//! The names a run gives what it makes on the host (network namespaces, root links), each with
//! the run's pid, and what runs that are gone left behind under those names. The cleanup sweeps
//! them at a start; the network namespaces name theirs by these rules.

use std::process::{Command, Stdio};

use crate::process::process_alive;

/// Where `ip netns` keeps the named namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// Every namespace of ours starts so.
pub(crate) const PREFIX: &str = "rinbox-";
/// Every root-namespace link of ours starts so.
pub(crate) const LINK_PREFIX: &str = "rin";

/// The names in `dir` that start with `prefix` and a pid, with whether that process is alive.
fn owned(dir: &str, prefix: &str) -> Vec<(String, bool)> {
    let owner = |rest: &str| rest.split(['-', 'x']).next()?.parse::<i32>().ok();
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let pid = name.strip_prefix(prefix).and_then(owner)?;
                    Some((name, process_alive(pid)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Namespaces and root links of ours whose process is gone: what a killed run left behind
/// (`namespace NAME` or `link NAME`).
pub fn leftovers() -> Vec<String> {
    let namespaces = owned(NETNS_DIR, PREFIX)
        .into_iter()
        .filter(|(_, alive)| !alive)
        .map(|(n, _)| format!("namespace {n}"));
    let links = owned("/sys/class/net", LINK_PREFIX)
        .into_iter()
        .filter(|(_, alive)| !alive)
        .map(|(n, _)| format!("link {n}"));
    namespaces.chain(links).collect()
}

/// Removes the namespaces and root links of runs whose process is gone.
pub(crate) fn sweep() {
    for left in leftovers() {
        match left.split_once(' ') {
            Some(("namespace", name)) => delete_namespace(name),
            Some((_, name)) => quietly("ip", &["link", "delete", name]),
            None => {}
        }
    }
}

/// The namespaces of this process that exist now (for the cleanup tests).
pub fn namespaces_of(pid: u32) -> Vec<String> {
    let mine = format!("{PREFIX}{pid}-");
    std::fs::read_dir(NETNS_DIR)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&mine))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a namespace of ours (at drop, at exit, or in a sweep).
pub(crate) fn delete_namespace(name: &str) {
    quietly("ip", &["netns", "delete", name]);
}

/// Runs `program` for its effect only: a removal whose failure leaves nothing to do.
pub(crate) fn quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
