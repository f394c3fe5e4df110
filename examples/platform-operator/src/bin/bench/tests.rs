//! The benchmark's parsers and arithmetic.

use super::counts::is_discovery;
use super::measure::{machine_cpu, process_cpu};
use super::*;

/// `/proc/<pid>/stat` of a process whose `comm` holds `) (` and spaces,
/// with utime 250, stime 50, cutime 1000, cstime 230 ticks.
const OWN: &str = "4242 (bench (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 1000 230 \
                   20 0 9 0 100 1000000 2000 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1";

#[test]
fn process_cpu_reads_the_fields_after_comm_in_seconds() {
    let (own, children) = process_cpu(OWN);
    assert!((own - 3.0).abs() < 1e-9, "{own}");
    assert!((children - 12.3).abs() < 1e-9, "{children}");
    assert_eq!(process_cpu(""), (0.0, 0.0));
    assert_eq!(process_cpu("1 (x) S"), (0.0, 0.0));
}

#[test]
fn machine_cpu_counts_guest_once_and_steal_as_not_busy() {
    // user nice system idle iowait irq softirq steal guest guest_nice
    let stat =
        "cpu  1000 100 300 5000 200 10 40 350 400 0\ncpu0 500 50 150 2500 100 5 20 175 200 0\n";
    let (busy, total) = machine_cpu(stat);
    assert!((busy - 14.5).abs() < 1e-9, "{busy}"); // user+nice+system+irq+softirq
    assert!((total - 70.0).abs() < 1e-9, "{total}"); // + idle + iowait + steal
    assert_eq!(machine_cpu("intr 1 2 3"), (0.0, 0.0));
}

#[test]
fn a_phase_is_the_difference_and_must_fit_in_the_machine() {
    let before = Cpu::parse(OWN, "cpu  1000 0 0 1000 0 0 0 0 0 0\n");
    let after = Cpu::parse(
        &OWN.replace(" 250 50 1000 230 ", " 450 50 2000 230 "),
        "cpu  2500 0 0 1500 0 0 0 0 0 0\n",
    );
    let phase = after - before;
    assert!((phase.operator - 2.0).abs() < 1e-9);
    assert!((phase.helm - 10.0).abs() < 1e-9);
    assert!((phase.machine_busy - 15.0).abs() < 1e-9);
    assert!((phase.machine_total - 20.0).abs() < 1e-9);
    let wall = Duration::from_secs(10);
    assert_eq!(phase.inconsistency(wall, 2), None);

    // 457 s of helm in a phase where the machine was busy 51 s: wrong.
    let impossible = Cpu {
        operator: 3.0,
        helm: 457.4,
        machine_busy: 51.2,
        machine_total: 51.2,
    };
    let wall = Duration::from_secs_f64(25.6);
    assert!(impossible.inconsistency(wall, 2).unwrap().contains("457.4"));

    // Clocks that ran ahead of the wall clock (a paused VM charged the
    // jump to helm, and to the machine's counters alike).
    let jumped = Cpu {
        operator: 3.0,
        helm: 457.4,
        machine_busy: 470.0,
        machine_total: 480.0,
    };
    assert!(jumped.inconsistency(wall, 2).unwrap().contains("paused"));
}

#[test]
fn discovery_paths_are_told_from_reads() {
    assert!(is_discovery("/api/v1"));
    assert!(is_discovery("/apis/apps/v1"));
    assert!(!is_discovery("/api/v1/namespaces/bench"));
    assert!(!is_discovery("/apis/apps/v1/namespaces/x/deployments"));
    assert!(!is_discovery("/apis"));
    assert!(!is_discovery("/version"));
}

#[test]
fn status_fields_are_read_in_kib() {
    let status = "Name:\tbench\nVmPeak:\t  900000 kB\nVmHWM:\t  123456 kB\nVmRSS:\t  100000 kB\n";
    assert_eq!(super::measure::status_kib(status, "VmHWM:"), 123_456);
    assert_eq!(super::measure::status_kib(status, "VmRSS:"), 100_000);
    assert_eq!(super::measure::status_kib(status, "VmSwap:"), 0);
    assert_eq!(super::measure::status_kib("", "VmHWM:"), 0);
}

#[test]
fn apiserver_requests_are_summed_over_every_series_only() {
    let text = "\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code=\"200\",component=\"apiserver\",resource=\"pods\",verb=\"LIST\"} 12
apiserver_request_total{code=\"201\",resource=\"a}b \\\"c\",verb=\"POST\"} 3.5
apiserver_request_total 4
apiserver_request_total_other{code=\"200\"} 1000
apiserver_request_duration_seconds_sum{verb=\"GET\"} 99
apiserver_request_total{code=\"200\"} not-a-number
";
    let total = super::flux::requests_total(text);
    assert!((total - 19.5).abs() < 1e-9, "{total}");
    assert!(super::flux::requests_total("").abs() < 1e-9);
}
