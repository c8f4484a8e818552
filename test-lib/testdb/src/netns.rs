//! Network namespaces that a run creates, joined by one bridge, for tests that fail real links:
//! a cluster node cut from its peers, a consumer cut from its node, one link cut, one way or
//! both.
//!
//! A [`Net`] is one bridge namespace (`br0`) and a member namespace per party (a node, the
//! platform, a consumer), each joined to the bridge by a veth pair and given one address on a
//! /24 of `10.0.0.0/8` that overlaps no route of the root namespace. A member has that /24 as
//! its only route besides loopback: it has no default route, so nothing it sends can leave the
//! run's bridge. The root namespace reaches the members only if [`Net::host_link`] gave it a
//! veth of its own into the bridge.
//!
//! Before anything connects, [`Net::check_route`] asks `ip route get` from the namespace that
//! will connect and fails unless the answer stays on the run's own link; [`Net::command`]
//! makes that check for every address a process will connect to, then enters the namespace
//! between fork and exec (`setns`).
//!
//! The failures: [`Net::isolate`] takes a member's bridge port down (a cable pulled: every
//! link of the member at once); [`Net::cut`] drops the traffic between two members, and
//! [`Net::cut_one_way`] the traffic from one to the other only, with `iptables` in the
//! receiving namespace (silent drops, as a failed link looks); [`Net::heal`] undoes them all.
//!
//! Names carry the owning process's pid (`rinbox-<pid>-<n>-<label>`, and the root's veth
//! `rin<pid>x<n>`). Everything is removed when the `Net` drops and when the process exits; a
//! killed run's namespaces and links are removed by the next run's sweep (`cleanup.rs`).

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::cleanup::{register, Cleanup};
use crate::error::Error;
use crate::leftovers::{delete_namespace, sweep, LINK_PREFIX, NETNS_DIR, PREFIX};
pub use crate::leftovers::{leftovers, namespaces_of};

/// The member's end of its veth pair, in its own namespace.
const MEMBER_IF: &str = "veth0";
/// The host number of the root namespace's address on the bridge.
const HOST_NUMBER: u8 = 254;

/// One party's namespace: its name, its address on the bridge, and an open handle on it.
#[derive(Debug)]
pub struct Member {
    label: String,
    ns: String,
    addr: Ipv4Addr,
    /// The bridge's end of the member's veth pair.
    port: String,
    handle: File,
}

impl Member {
    /// What the test called it (`node1`, `orbit`, `consumer-a`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The namespace's name, as `ip netns list` shows it.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Its address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// A command that runs `program` in this namespace, for a server that only accepts
    /// connections there; a process that connects out is made by [`Net::command`], which
    /// checks its routes first.
    pub fn server_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        self.enter(&mut cmd);
        cmd
    }

    /// Runs `f` on a thread of this process that has entered the namespace (a test's own
    /// listener or client there), and returns what it returns.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&self.handle, nix::sched::CloneFlags::CLONE_NEWNET).map_err(
                        |e| Error::io(format!("cannot enter the namespace {}", self.ns))(e.into()),
                    )?;
                    Ok(f())
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Makes `cmd` run in this namespace: it enters it between fork and exec. Check the routes
    /// first ([`Net::command`] does).
    pub(crate) fn enter(&self, cmd: &mut Command) {
        let fd = self.handle.as_raw_fd();
        // SAFETY: setns is one system call, async-signal-safe, and allocates nothing; the
        // descriptor stays open as long as the member, which outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                let fd = BorrowedFd::borrow_raw(fd);
                nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
    }
}

/// The root namespace's own veth into the bridge.
#[derive(Debug)]
struct HostLink {
    name: String,
    addr: Ipv4Addr,
}

/// A bridge and its member namespaces; see the module's documentation.
#[derive(Debug)]
pub struct Net {
    tag: String,
    subnet: [u8; 3],
    bridge: String,
    members: Mutex<Vec<Arc<Member>>>,
    host: Mutex<Option<HostLink>>,
}

/// Runs `ip` with `args`; its standard output, or an error naming the command and what it said.
fn ip(args: &[&str]) -> Result<String, Error> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(Error::io(format!("cannot run {program}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Config(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether `iptables` is installed (one-way and link cuts need it).
fn iptables() -> Result<(), Error> {
    match Command::new("iptables")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        _ => Err(Error::NoServerProgram(
            "iptables is not installed: cutting one link needs it (scripts/install-deps installs Debian's iptables)".into(),
        )),
    }
}

/// The IPv4 prefixes (address, length) of every route and address the root namespace has,
/// the default route excepted.
fn root_prefixes() -> Result<Vec<(Ipv4Addr, u8)>, Error> {
    let routes = ip(&["-4", "-o", "route", "show", "table", "all"])?;
    let addrs = ip(&["-4", "-o", "addr", "show"])?;
    let mut found = Vec::new();
    let words = routes
        .lines()
        .flat_map(|l| {
            let mut w = l.split_whitespace();
            // `local 127.0.0.1 …`, `broadcast …`: the type comes first.
            let first = w.next().unwrap_or_default();
            let dest = match first {
                "local" | "broadcast" | "unicast" | "anycast" | "multicast" | "blackhole"
                | "unreachable" | "prohibit" | "throw" => w.next().unwrap_or_default(),
                d => d,
            };
            Some(dest.to_owned())
        })
        .chain(addrs.lines().filter_map(|l| {
            let mut w = l.split_whitespace();
            w.position(|x| x == "inet")?;
            w.next().map(str::to_owned)
        }));
    for word in words {
        if word == "default" {
            continue;
        }
        let (addr, len) = word.split_once('/').unwrap_or((&word, "32"));
        if let (Ok(a), Ok(l)) = (addr.parse::<Ipv4Addr>(), len.parse::<u8>()) {
            found.push((a, l.min(32)));
        }
    }
    Ok(found)
}

/// Whether `10.a.b.0/24` overlaps `prefix`.
fn overlaps(subnet: [u8; 3], (addr, len): (Ipv4Addr, u8)) -> bool {
    let ours = u32::from(Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 0));
    let theirs = u32::from(addr);
    let len = u32::from(len.min(24));
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    ours & mask == theirs & mask
}

/// A /24 in `10.0.0.0/8` that overlaps none of `taken`, tried from a place `start` picks.
fn free_subnet(taken: &[(Ipv4Addr, u8)], start: u32) -> Option<[u8; 3]> {
    (0..(56 * 256))
        .map(|i| (start + i) % (56 * 256))
        .map(|n| [10, 200 + (n / 256) as u8, (n % 256) as u8])
        .find(|s| !taken.iter().any(|p| overlaps(*s, *p)))
}

impl Net {
    /// Creates the bridge namespace on a /24 that overlaps no route of the root namespace.
    /// Needs root (`CAP_NET_ADMIN`).
    pub fn create() -> Result<Net, Error> {
        if !crate::process::is_root() {
            return Err(Error::Config(
                "network namespaces need root (CAP_NET_ADMIN)".into(),
            ));
        }
        crate::cleanup::remove_at_exit();
        sweep();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{pid}-{seq}");
        let taken = root_prefixes()?;
        let subnet = free_subnet(&taken, pid.wrapping_mul(7919).wrapping_add(seq as u32))
            .ok_or_else(|| {
                Error::Config("every /24 of 10.200.0.0-10.255.255.255 overlaps a route".into())
            })?;
        let bridge = format!("{PREFIX}{tag}-bridge");
        ip(&["netns", "add", &bridge])?;
        register(Cleanup::Namespace(bridge.clone()));
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br0", "up"])?;
        Ok(Net {
            tag,
            subnet,
            bridge,
            members: Mutex::new(Vec::new()),
            host: Mutex::new(None),
        })
    }

    /// The /24 the run uses, e.g. `10.213.7.0/24`.
    pub fn subnet(&self) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.0/24")
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Member>>> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new member namespace joined to the bridge, with the next address. `label` is at most
    /// 12 characters of `[a-z0-9-]`.
    pub fn add(&self, label: &str) -> Result<Arc<Member>, Error> {
        let valid = !label.is_empty()
            && label.len() <= 12
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(Error::Config(format!(
                "a member's label is 1-12 characters of a-z, 0-9 and -: {label:?}"
            )));
        }
        let mut members = self.members();
        if members.iter().any(|m| m.label == label) {
            return Err(Error::Config(format!(
                "the net already has a member {label}"
            )));
        }
        let number = u8::try_from(members.len() + 1)
            .ok()
            .filter(|n| *n < HOST_NUMBER)
            .ok_or_else(|| Error::Config("a net holds at most 253 members".into()))?;
        let [a, b, c] = self.subnet;
        let addr = Ipv4Addr::new(a, b, c, number);
        let ns = format!("{PREFIX}{}-{label}", self.tag);
        let port = format!("p-{label}");
        ip(&["netns", "add", &ns])?;
        register(Cleanup::Namespace(ns.clone()));
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "link",
            "add",
            MEMBER_IF,
            "netns",
            &ns,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.bridge,
        ])?;
        ip(&[
            "-n",
            &self.bridge,
            "link",
            "set",
            &port,
            "master",
            "br0",
            "up",
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            MEMBER_IF,
        ])?;
        ip(&["-n", &ns, "link", "set", MEMBER_IF, "up"])?;
        let handle = File::open(format!("{NETNS_DIR}/{ns}"))
            .map_err(Error::io(format!("cannot open {NETNS_DIR}/{ns}")))?;
        let member = Arc::new(Member {
            label: label.to_owned(),
            ns,
            addr,
            port,
            handle,
        });
        members.push(member.clone());
        Ok(member)
    }

    /// Gives the root namespace a veth of its own into the bridge (once), so that the test
    /// process itself can reach the members; its address on the bridge.
    pub fn host_link(&self) -> Result<Ipv4Addr, Error> {
        let mut host = self.host.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = host.as_ref() {
            return Ok(h.addr);
        }
        let name = format!("{LINK_PREFIX}{}", self.tag.replace('-', "x"));
        let [a, b, c] = self.subnet;
        let addr = Ipv4Addr::new(a, b, c, HOST_NUMBER);
        ip(&[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            "p-host",
            "netns",
            &self.bridge,
        ])?;
        register(Cleanup::Link(name.clone()));
        ip(&[
            "-n",
            &self.bridge,
            "link",
            "set",
            "p-host",
            "master",
            "br0",
            "up",
        ])?;
        ip(&["addr", "add", &format!("{addr}/24"), "dev", &name])?;
        ip(&["link", "set", &name, "up"])?;
        *host = Some(HostLink { name, addr });
        Ok(addr)
    }

    /// Fails unless `ip route get <to>`, asked from `from`'s namespace (the root namespace for
    /// `None`), names the run's own link and no gateway, and `to` is an address of the run.
    pub fn check_route(&self, from: Option<&Member>, to: Ipv4Addr) -> Result<(), Error> {
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner());
        let ours = self.members().iter().any(|m| m.addr == to)
            || host.as_ref().is_some_and(|h| h.addr == to);
        let (who, device, answer) = match from {
            Some(m) => (
                m.label.clone(),
                MEMBER_IF,
                ip(&["-n", &m.ns, "-o", "route", "get", &to.to_string()]),
            ),
            None => match host.as_ref() {
                Some(h) => (
                    "the root namespace".to_owned(),
                    h.name.as_str(),
                    ip(&["-o", "route", "get", &to.to_string()]),
                ),
                None => {
                    return Err(Error::Config(format!(
                        "the root namespace has no link into the run's bridge: it must not connect to {to}"
                    )))
                }
            },
        };
        let answer = answer.map_err(|e| {
            Error::Config(format!(
                "refusing to connect from {who} to {to}: no route on the run's bridge on {} ({e})",
                self.subnet()
            ))
        })?;
        let words: Vec<&str> = answer.split_whitespace().collect();
        let on = |key: &str| {
            words
                .windows(2)
                .find(|w| w[0] == key)
                .map(|w| w[1].to_owned())
        };
        let dev = on("dev");
        let local = words.first() == Some(&"local");
        if !ours || on("via").is_some() || (dev.as_deref() != Some(device) && !local) {
            return Err(Error::Config(format!(
                "refusing to connect from {who} to {to}: the route there leaves the run's bridge on {} ({})",
                self.subnet(),
                answer.trim()
            )));
        }
        Ok(())
    }

    /// A command that runs `program` in `member`'s namespace, once every address in
    /// `connects_to` was checked to route on the run's bridge from there.
    pub fn command(
        &self,
        member: &Member,
        program: impl AsRef<std::ffi::OsStr>,
        connects_to: &[Ipv4Addr],
    ) -> Result<Command, Error> {
        for to in connects_to {
            self.check_route(Some(member), *to)?;
        }
        let mut cmd = Command::new(program);
        member.enter(&mut cmd);
        Ok(cmd)
    }

    /// Takes `member`'s port on the bridge down (`true`) or up: every link of it fails at once.
    pub fn isolate(&self, member: &Member, cut: bool) -> Result<(), Error> {
        let state = if cut { "down" } else { "up" };
        ip(&["-n", &self.bridge, "link", "set", &member.port, state]).map(drop)
    }

    /// Drops every packet from `from` at `to` (`iptables` in `to`'s namespace): one way.
    pub fn cut_one_way(&self, from: &Member, to: &Member) -> Result<(), Error> {
        iptables()?;
        run(
            "ip",
            &[
                "netns",
                "exec",
                &to.ns,
                "iptables",
                "-A",
                "INPUT",
                "-s",
                &from.addr.to_string(),
                "-j",
                "DROP",
            ],
        )
        .map(drop)
    }

    /// Drops the packets between `a` and `b`, both ways.
    pub fn cut(&self, a: &Member, b: &Member) -> Result<(), Error> {
        self.cut_one_way(a, b)?;
        self.cut_one_way(b, a)
    }

    /// Undoes every cut: all ports up, every drop rule gone.
    pub fn heal(&self) -> Result<(), Error> {
        let members = self.members().clone();
        let rules = iptables().is_ok();
        for m in &members {
            self.isolate(m, false)?;
            if rules {
                run("ip", &["netns", "exec", &m.ns, "iptables", "-F", "INPUT"])?;
            }
        }
        Ok(())
    }

    /// The members, in the order they were added.
    pub fn all(&self) -> Vec<Arc<Member>> {
        self.members().clone()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = host {
            let _ = ip(&["link", "delete", &h.name]);
        }
        for m in self.members().drain(..) {
            delete_namespace(&m.ns);
        }
        delete_namespace(&self.bridge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_overlapping_a_route_is_never_chosen() {
        let taken = [
            (Ipv4Addr::new(10, 200, 0, 0), 16),
            (Ipv4Addr::new(10, 201, 0, 7), 32),
        ];
        let s = free_subnet(&taken, 0).unwrap();
        assert_eq!(s, [10, 201, 1]);
        assert!(overlaps([10, 200, 9], taken[0]));
        assert!(!overlaps([10, 202, 0], taken[0]));
        assert!(overlaps([10, 5, 5], (Ipv4Addr::new(10, 0, 0, 0), 8)));
        assert!(free_subnet(&[(Ipv4Addr::new(10, 0, 0, 0), 8)], 3).is_none());
    }
}
