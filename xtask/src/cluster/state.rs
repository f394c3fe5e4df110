//! `state.json`: what `up` started, so `down` and `status` find exactly those
//! processes again (and never a process that reused one of their PIDs).

use std::fs;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::json;

use super::pki::write_file;

pub(super) const STATE_FILE: &str = "state.json";

/// One process `up` started: enough to find it again, and only it.
#[derive(Debug, Clone)]
pub(super) struct Started {
    pub(super) component: String,
    pub(super) pid: u32,
    /// Start time from /proc (clock ticks since boot), so a reused PID is never signalled.
    pub(super) start_time: u64,
}

impl Started {
    pub(super) fn alive(&self) -> bool {
        proc_stat(self.pid)
            .is_some_and(|(state, start)| start == self.start_time && state != 'Z' && state != 'X')
    }
}

/// `(state, starttime)` from `/proc/PID/stat`.
pub(super) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let state = fields.first()?.chars().next()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some((state, start_time))
}

/// Resident memory of `pid` in KiB.
pub(super) fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The contents of `state.json`.
pub(super) struct State {
    pub(super) server: String,
    pub(super) processes: Vec<Started>,
}

impl State {
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let processes: Vec<_> = self
            .processes
            .iter()
            .map(|p| json!({"component": p.component, "pid": p.pid, "start_time": p.start_time}))
            .collect();
        let text =
            serde_json::to_string_pretty(&json!({"server": self.server, "processes": processes}))?;
        write_file(&dir.join(STATE_FILE), &text, 0o644)
    }

    pub(super) fn load(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(STATE_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("could not read {}", path.display())),
        };
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        let bad = || format!("{} is malformed", path.display());
        let server = value["server"].as_str().with_context(bad)?.to_owned();
        let mut processes = Vec::new();
        for p in value["processes"].as_array().with_context(bad)? {
            processes.push(Started {
                component: p["component"].as_str().with_context(bad)?.to_owned(),
                pid: p["pid"]
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
                    .with_context(bad)?,
                start_time: p["start_time"].as_u64().with_context(bad)?,
            });
        }
        Ok(Some(Self { server, processes }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_reads_this_process() {
        let (state, start) = proc_stat(std::process::id()).expect("own /proc entry");
        assert!(matches!(state, 'R' | 'S'), "state {state}");
        assert!(start > 0);
        let me = Started {
            component: "me".into(),
            pid: std::process::id(),
            start_time: start,
        };
        assert!(me.alive());
        let impostor = Started {
            start_time: start + 1,
            ..me
        };
        assert!(
            !impostor.alive(),
            "a different start time means a reused pid"
        );
    }

    #[test]
    fn state_round_trips_and_rejects_garbage() {
        let dir = std::env::temp_dir().join(format!("xtask-state-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        assert!(State::load(&dir).expect("no file").is_none());
        let state = State {
            server: "https://127.0.0.1:1".to_owned(),
            processes: vec![Started {
                component: "etcd".to_owned(),
                pid: 7,
                start_time: 42,
            }],
        };
        state.save(&dir).expect("save");
        let loaded = State::load(&dir).expect("load").expect("a state");
        assert_eq!(loaded.server, state.server);
        assert_eq!(loaded.processes.len(), 1);
        assert_eq!(loaded.processes[0].component, "etcd");
        assert_eq!(
            (loaded.processes[0].pid, loaded.processes[0].start_time),
            (7, 42)
        );
        fs::write(dir.join(STATE_FILE), r#"{"server": 1}"#).expect("write");
        let error = State::load(&dir).err().expect("malformed");
        assert!(error.to_string().contains("malformed"), "{error}");
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
