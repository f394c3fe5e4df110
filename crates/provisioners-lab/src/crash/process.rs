//! The processes this test started that talk through a proxy (helm, or
//! whatever CLI a user's tree drives), found through `/proc`, so a crash
//! can kill them as the death of their parent would. Linux only (`/proc`).
//!
//! [`CrashTest`](super::CrashTest) uses these; they are public so that a
//! test can check them against a child of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Descendants of this process with a TCP connection to 127.0.0.1:`port`
/// and none to another of `other_ports` (another test's proxy: that
/// process is someone else's).
pub fn connected_descendants_only(port: u16, other_ports: &BTreeSet<u16>) -> Vec<i32> {
    let inodes = socket_inodes_to(port);
    if inodes.is_empty() {
        return Vec::new();
    }
    let others: BTreeSet<u64> = other_ports
        .iter()
        .filter(|p| **p != port)
        .flat_map(|p| socket_inodes_to(*p))
        .collect();
    descendants()
        .into_iter()
        .filter(|pid| {
            let sockets = socket_fds(*pid);
            sockets.iter().any(|i| inodes.contains(i))
                && !sockets.iter().any(|i| others.contains(i))
        })
        .collect()
}

/// Descendants of this process with a TCP connection to 127.0.0.1:`port`.
pub fn connected_descendants(port: u16) -> Vec<i32> {
    connected_descendants_only(port, &BTreeSet::new())
}

/// The socket inodes among `pid`'s open files.
fn socket_fds(pid: i32) -> Vec<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| {
            let target = fs::read_link(fd.path()).ok()?;
            target
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inode| inode.parse::<u64>().ok())
        })
        .collect()
}

/// SIGKILLs `pid`, and its whole group when it leads one (helm does).
pub fn kill_hard(pid: i32) {
    let leads_group = stat(pid).is_some_and(|s| s.pgrp == pid);
    let _ = if leads_group {
        killpg(Pid::from_raw(pid), Signal::SIGKILL)
    } else {
        kill(Pid::from_raw(pid), Signal::SIGKILL)
    };
}

struct Stat {
    ppid: i32,
    pgrp: i32,
}

fn stat(pid: i32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    let close = text.rfind(')')?;
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(Stat { ppid, pgrp })
}

/// Every descendant of this process (children, their children, ...), by pid.
pub fn descendants() -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some(stat) = stat(pid) {
                children.entry(stat.ppid).or_default().push(pid);
            }
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![me];
    while let Some(parent) = todo.pop() {
        for child in children.get(&parent).into_iter().flatten() {
            found.push(*child);
            todo.push(*child);
        }
    }
    found
}

/// Inodes of TCP sockets whose remote end is 127.0.0.1:`port` (or `::1`).
fn socket_inodes_to(port: u16) -> BTreeSet<u64> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(inode)) = (fields.get(2), fields.get(9)) else {
                continue;
            };
            let remote_port = remote
                .rsplit_once(':')
                .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok());
            if remote_port == Some(port)
                && let Ok(inode) = inode.parse::<u64>()
                && inode != 0
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}
