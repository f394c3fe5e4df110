//! What the bench reads off the machine: resident memory, CPU per phase
//! (the operator, its helm children, the whole machine as the bound) and
//! the load average.

use std::time::Duration;

/// Resident set size of process `pid`, in KiB.
pub(super) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status_kib(&status, "VmRSS:")
}

/// Peak resident set size of process `pid` over its life (`VmHWM`), in KiB.
pub(super) fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status_kib(&status, "VmHWM:")
}

/// The `field` line (`VmRSS:`, `VmHWM:`) of a `/proc/<pid>/status` text, in
/// KiB (0 when missing).
pub(super) fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Clock ticks per second in `/proc/<pid>/stat` and `/proc/stat`: the
/// kernel's `USER_HZ`, 100 on every Linux architecture we run on (x86_64,
/// arm64; only alpha and ia64 differ).
pub(super) const USER_HZ: f64 = 100.0;

/// CPU time in seconds, as the kernel counts it: this process (the
/// operator, every thread), the children it has waited for (helm, with
/// whatever they waited for), and the whole machine (every process on every
/// core: the bound the first two must fit in, and the load beside them).
///
/// Read at the start and the end of a phase; the difference is the phase's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Cpu {
    /// `utime + stime` of this process.
    pub(super) operator: f64,
    /// `cutime + cstime`: reaped children only, so a helm still running is
    /// counted when it exits (see [`settle_helm`](super::settle_helm)).
    pub(super) helm: f64,
    /// Busy time of all cores (`user nice system irq softirq` of `/proc/stat`).
    pub(super) machine_busy: f64,
    /// All time of all cores, busy or not (busy, `idle iowait steal`).
    pub(super) machine_total: f64,
}

impl Cpu {
    /// Now, from `/proc/self/stat` and `/proc/stat` (zeros if unreadable).
    pub(super) fn now() -> Cpu {
        let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        Cpu::parse(&own, &machine)
    }

    pub(super) fn parse(own_stat: &str, machine_stat: &str) -> Cpu {
        let (operator, helm) = process_cpu(own_stat);
        let (machine_busy, machine_total) = machine_cpu(machine_stat);
        Cpu {
            operator,
            helm,
            machine_busy,
            machine_total,
        }
    }

    /// What a phase of `wall` time on `cores` cores fails to explain: our
    /// own and helm's time beyond what the whole machine was busy for, or
    /// the machine's clocks running ahead of the wall clock (a VM paused or
    /// restored mid-run charges the jump to whatever was running). A little
    /// slack covers the tick rounding of separate counters. `None` when the
    /// numbers fit.
    pub(super) fn inconsistency(&self, wall: Duration, cores: usize) -> Option<String> {
        let ours = self.operator + self.helm;
        let possible = wall.as_secs_f64() * cores as f64;
        if self.machine_total > possible * 1.05 + 1.0 {
            return Some(format!(
                "the cores' clocks advanced {:.1} s in {:.1} s of wall time on {cores} cores \
                 (at most {possible:.1} s): the VM was paused or its clock jumped; CPU figures \
                 of this phase are not usable",
                self.machine_total,
                wall.as_secs_f64()
            ));
        }
        (ours > self.machine_busy * 1.02 + 0.5).then(|| {
            format!(
                "operator {:.1} s + helm {:.1} s is more than the machine's {:.1} s busy: the \
                 accounting is wrong",
                self.operator, self.helm, self.machine_busy
            )
        })
    }
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, before: Cpu) -> Cpu {
        Cpu {
            operator: self.operator - before.operator,
            helm: self.helm - before.helm,
            machine_busy: self.machine_busy - before.machine_busy,
            machine_total: self.machine_total - before.machine_total,
        }
    }
}

/// `(utime + stime, cutime + cstime)` in seconds from a `/proc/<pid>/stat`
/// line. The fields are counted after the last `)`, since `comm` may hold
/// spaces and parentheses: there `state` is field 3, `utime` 14, `stime`
/// 15, `cutime` 16, `cstime` 17 (proc(5)).
pub(super) fn process_cpu(stat: &str) -> (f64, f64) {
    let after_comm: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let field = |n: usize| {
        after_comm
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0) as f64
            / USER_HZ
    };
    (field(14) + field(15), field(16) + field(17))
}

/// `(busy, total)` seconds of all cores from `/proc/stat`'s `cpu` line:
/// `user nice system idle iowait irq softirq steal guest guest_nice`.
/// `guest` and `guest_nice` are already inside `user` and `nice`, so they
/// are not added again; `steal` (another VM had the core) is neither ours
/// nor idle: it counts in the total only.
pub(super) fn machine_cpu(stat: &str) -> (f64, f64) {
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0) as f64 / USER_HZ;
    let busy = at(0) + at(1) + at(2) + at(5) + at(6);
    let total = busy + at(3) + at(4) + at(7);
    (busy, total)
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` says them.
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join("/"))
        .unwrap_or_else(|| "?".to_owned())
}

/// Prints a phase's CPU: ours, helm's, and the machine's busy time against
/// what its cores could give in that time, with the load averages. `wall`
/// is the span the counters were read over (the phase, the controller's
/// graceful shutdown and the wait for helm runs to end), which may be longer
/// than the phase's own figure.
pub(super) fn report_cpu(what: &str, cpu: Cpu, wall: Duration, load_before: &str) {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    println!(
        "  CPU {what} (over {:.1} s): operator {:.1} s, helm {:.1} s; the machine was busy {:.1} s \
         of {:.1} s ({cores} cores; load {load_before} -> {})",
        wall.as_secs_f64(),
        cpu.operator,
        cpu.helm,
        cpu.machine_busy,
        cpu.machine_total,
        load_average()
    );
    if let Some(problem) = cpu.inconsistency(wall, cores) {
        println!("  WARNING: {problem}");
    }
}

/// The process ids of this process's `helm` children.
pub(super) fn helm_children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after ')'.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(comm, _)| comm)
                .unwrap_or("");
            after.split_whitespace().nth(1) == Some(me.as_str()) && comm.starts_with("helm")
        })
        .collect()
}

/// The summed RSS of this process's `helm` children, in KiB.
pub(super) fn helm_rss_kib() -> u64 {
    helm_children().into_iter().map(rss_kib).sum()
}
