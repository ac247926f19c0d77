//! The project's scripts touch only what they started: none kills a process
//! by name, and packages are installed through `scripts/apt.sh`, which keeps
//! their services from starting (so nothing needs stopping afterwards).

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn scripts() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in ["scripts", ".ci"] {
        for entry in std::fs::read_dir(Path::new(ROOT).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            out.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
        }
    }
    out
}

#[test]
fn no_script_kills_by_name_or_installs_around_the_guard() {
    let all = scripts();
    assert!(all.len() >= 5, "found the scripts: {:?}", all.iter().map(|(p, _)| p).collect::<Vec<_>>());
    for (path, text) in &all {
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            for killer in ["pkill", "killall", "kill -9 $(pgrep", "service nginx stop", "systemctl stop"] {
                assert!(!line.contains(killer), "{path} stops what it did not start: {line}");
            }
            if line.contains("apt-get install") {
                assert!(path.ends_with("scripts/apt.sh"), "{path} installs packages without the start guard: {line}");
            }
        }
    }
}

/// Runs `apt_install` with a stand-in `apt-get` that asks the policy file
/// whether a service may start, as a package's maintainer script would.
fn install_with_stand_in(policy: &Path) -> (String, std::process::ExitStatus) {
    let bin = tempfile::tempdir().unwrap();
    let log = bin.path().join("log");
    let fake = bin.path().join("apt-get");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ncase \"$1\" in update) exit 0;; esac\nif [ -x '{p}' ]; then '{p}' nginx start; echo \"start:$?\" >>'{l}'; else echo start:allowed >>'{l}'; fi\necho \"args:$*\" >>'{l}'\n",
            p = policy.display(),
            l = log.display()
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
    let script = format!(". '{ROOT}/scripts/apt.sh'; id() {{ echo 0; }}; apt_install nginx-light libnginx-mod-nchan");
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("PATH", format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap()))
        .env("POLICY_RC_D", policy)
        .status()
        .unwrap();
    (std::fs::read_to_string(&log).unwrap_or_default(), status)
}

#[test]
fn packages_install_with_every_service_start_denied_and_the_guard_removed() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy-rc.d");
    let (log, status) = install_with_stand_in(&policy);
    assert!(status.success());
    assert!(log.contains("start:101"), "a service start during the install is denied: {log}");
    assert!(log.contains("args:install -y -qq --no-install-recommends nginx-light libnginx-mod-nchan"), "{log}");
    assert!(!policy.exists(), "the guard is gone after the install");

    // A machine's own policy is used as it is and left in place.
    std::fs::write(&policy, "#!/bin/sh\nexit 0\n").unwrap();
    Command::new("chmod").arg("+x").arg(&policy).status().unwrap();
    let (log, _) = install_with_stand_in(&policy);
    assert!(log.contains("start:0"), "{log}");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), "#!/bin/sh\nexit 0\n", "the machine's own policy is untouched");
}

/// The scripts share one library (`scripts/lib.sh`) for ports, starting a
/// server and stopping what they started: no script keeps its own copy,
/// nor picks a port by binding port 0 (inside the ephemeral range, where a
/// benchmark's thousands of client connections may hold it).
#[test]
fn the_scripts_share_one_library() {
    let all = scripts();
    for (path, text) in &all {
        let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
        if path.ends_with("scripts/lib.sh") {
            continue;
        }
        for own in ["free_port()", "wait_up()", "wait_port()", "free_port ()"] {
            assert!(!code.iter().any(|l| l.contains(own)), "{path} keeps its own {own}");
        }
        for line in &code {
            assert!(!line.contains("bind((\"127.0.0.1\", 0))") && !line.contains("bind((\"127.0.0.1\",0))"), "{path}: {line}");
            assert!(!(line.contains("$(seq") && line.contains("curl")), "{path} polls by hand instead of wait_up: {line}");
        }
    }
}

/// The library's `serve` starts a server on a port below the ephemeral
/// range and waits until it answers; `stop_pid` stops that one process and
/// forgets it.
#[test]
fn the_library_serves_on_a_port_below_the_ephemeral_range_and_stops_by_pid() {
    let data = tempfile::tempdir().unwrap();
    let script = r#"set -euo pipefail
        . scripts/lib.sh
        BIN=$1
        port=$(free_port)
        serve "$port" TIDINGS_DATA_DIR="$2"
        curl -sf -o /dev/null "http://127.0.0.1:$port/health"
        echo "$port ${#STARTED[@]}"
        stop_pid "$SERVED"
        if kill -0 "$SERVED" 2>/dev/null; then echo running; else echo stopped; fi
        echo "${#STARTED[@]}""#;
    let out = Command::new("bash")
        .current_dir(ROOT)
        .args(["-c", script, "lib-test", env!("CARGO_BIN_EXE_tidings")])
        .arg(data.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let (port, started) = lines[0].split_once(' ').unwrap();
    let ephemeral_from: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    assert!(port.parse::<u16>().unwrap() < ephemeral_from, "{port} is inside the ephemeral range from {ephemeral_from}");
    assert_eq!((started, lines[1], lines[2]), ("1", "stopped", "0"), "{stdout}");
}
