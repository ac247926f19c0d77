//! `deploy/k8s` validates offline (`scripts/validate-k8s.py`, in the
//! virtual environment `scripts/test` prepares): the core objects against
//! Kubernetes' schemas, the CloudNativePG `Cluster` against the operator's
//! own CRD, both strictly. The validator is shown to refuse: a typo in the
//! Cluster and a wrong type in the Deployment fail. The script itself is
//! typed (`mypy --strict`).

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn python() -> String {
    std::env::var("TIDINGS_TEST_K8S_PYTHON").expect("TIDINGS_TEST_K8S_PYTHON is not set: run the suite with scripts/test")
}

/// Runs the validator on `dir`: its exit status and what it printed.
fn validate(dir: &Path) -> (bool, String) {
    let out = Command::new(python()).arg(Path::new(ROOT).join("scripts/validate-k8s.py")).arg(dir).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_kubernetes_manifests_validate_and_a_broken_one_does_not() {
    let k8s = Path::new(ROOT).join("deploy/k8s");
    let (ok, said) = validate(&k8s);
    assert!(ok, "{said}");
    for kind in ["Deployment/tidings", "Service/tidings", "PodDisruptionBudget/tidings", "Cluster/tidings-db"] {
        assert!(said.contains(&format!("{kind}: valid")), "{kind} was checked: {said}");
    }
    // The topology DESIGN names: the primary's -rw service for writes, the
    // -ro service of the hot standbys for history, readiness on the drain.
    let deployment = std::fs::read_to_string(k8s.join("deployment.yaml")).unwrap();
    for needed in ["@tidings-db-rw:5432/tidings", "TIDINGS_REPLICA_URLS", "@tidings-db-ro:5432/tidings", "path: /health/ready"] {
        assert!(deployment.contains(needed), "deployment.yaml has {needed}");
    }
    // The configuration that loses nothing in a failover: synchronous
    // replication that waits rather than degrades, and delivery that waits
    // for it.
    assert!(deployment.contains("{name: TIDINGS_DELIVERY, value: replicated}"), "deployment.yaml waits for the standby");
    let postgres = std::fs::read_to_string(k8s.join("postgres.yaml")).unwrap();
    for needed in ["    synchronous:\n", "      dataDurability: required\n", "      failoverQuorum: true\n"] {
        assert!(postgres.contains(needed), "postgres.yaml has {needed}");
    }

    // Broken copies are refused.
    for (file, from, to, error) in [
        ("postgres.yaml", "  instances: 3", "  instance: 3", "'instance' was unexpected"),
        ("deployment.yaml", "  replicas: 3", "  replicas: three", "'three' is not of type"),
        ("postgres.yaml", "dataDurability: required", "dataDurability: always", "'always' is not one of"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("schemas")).unwrap();
        for schema in std::fs::read_dir(k8s.join("schemas")).unwrap() {
            let schema = schema.unwrap().path();
            std::fs::copy(&schema, dir.path().join("schemas").join(schema.file_name().unwrap())).unwrap();
        }
        let text = std::fs::read_to_string(k8s.join(file)).unwrap();
        assert!(text.contains(from), "{file} has {from}");
        std::fs::write(dir.path().join(file), text.replace(from, to)).unwrap();
        let (ok, said) = validate(dir.path());
        assert!(!ok && said.contains(error), "{file} with {to:?} was not refused: {said}");
    }

    let mypy = Path::new(&python()).with_file_name("mypy");
    let out = Command::new(mypy).arg("--strict").arg(Path::new(ROOT).join("scripts/validate-k8s.py")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// The Deployment runs one server identity from the Secret it documents,
/// writes nothing to its read-only root filesystem, and runs as Pod
/// Security's "restricted" profile asks (no service account token, every
/// capability dropped, the runtime's seccomp profile, a pinned image).
#[test]
fn the_deployment_shares_one_identity_and_is_hardened() {
    let deployment = std::fs::read_to_string(Path::new(ROOT).join("deploy/k8s/deployment.yaml")).unwrap();
    for needed in [
        "{name: TIDINGS_SERVER_KEY_FILE, value: /etc/tidings/identity/server.key}",
        "{name: identity, mountPath: /etc/tidings/identity, readOnly: true}",
        "secretName: tidings",
        "items: [{key: server-key, path: server.key}]",
        "{secretKeyRef: {name: tidings, key: jwt-secret}}",
        // The Secret's keys, created as the header says.
        "--from-literal=jwt-secret=",
        "--from-file=server-key=server.key",
        "openssl genpkey -algorithm ed25519 -out server.key",
        "readOnlyRootFilesystem: true",
        "automountServiceAccountToken: false",
        "capabilities: {drop: [ALL]}",
        "seccompProfile: {type: RuntimeDefault}",
    ] {
        assert!(deployment.contains(needed), "deployment.yaml has {needed}");
    }
    assert!(!deployment.contains(":latest"), "the image is pinned");
    let policy = std::fs::read_to_string(Path::new(ROOT).join("deploy/k8s/networkpolicy.yaml")).unwrap();
    assert!(policy.contains("policyTypes: [Ingress, Egress]") && policy.contains("port: 5432"), "{policy}");
}

/// What `docker build` is sent: not target/, data directories or
/// node_modules, and everything the build reads (every file an
/// `include_str!`/`include_bytes!` names, the migrations, the registry
/// the build embeds). The image checks its own health with `tidings
/// health`; the Compose file starts PostgreSQL first.
#[test]
fn the_container_build_sends_what_it_needs_and_nothing_else() {
    let ignore = std::fs::read_to_string(Path::new(ROOT).join(".dockerignore")).unwrap();
    let patterns: Vec<&str> = ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let ignored = |path: &str| {
        patterns.iter().any(|p| match p.strip_prefix("**/") {
            Some(name) => path.split('/').any(|part| part == name),
            None => path == *p || path.starts_with(&format!("{p}/")),
        })
    };
    for heavy in
        ["target/release/tidings", "tidings-data/events.db", "clients/js/node_modules/x", "tests/browser/node_modules/x", ".git/HEAD"]
    {
        assert!(ignored(heavy), "{heavy} is not sent");
    }
    let mut needed = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned(), "registry/hypothesis.created.json".to_owned()];
    let include = regex::Regex::new(r#"include_(?:str|bytes)!\(\s*"([^"]+)""#).unwrap();
    for crate_dir in ["crates/server/src", "crates/protocol/src", "crates/client/src", "crates/cli/src", "src"] {
        for file in crate::layers::rust_files(&Path::new(ROOT).join(crate_dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for found in include.captures_iter(&text) {
                let path = file.parent().unwrap().join(&found[1]);
                let path = std::fs::canonicalize(&path).unwrap_or_else(|_| panic!("{} names {}", file.display(), &found[1]));
                needed.push(path.strip_prefix(ROOT).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    assert!(needed.iter().any(|n| n == "clients/js/dist/tidings.js"), "the scan found the embedded client: {needed:?}");
    for path in &needed {
        assert!(Path::new(ROOT).join(path).exists(), "{path}");
        assert!(!ignored(path), "{path} is needed by the build and left out by .dockerignore");
    }
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile
            .contains(r#"HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["/usr/local/bin/tidings", "health"]"#)
    );
    assert!(dockerfile.contains("docker run -p 8080:8080 -v tidings-data:/data"), "a docker run example with a volume");
    // The Compose file: well-formed, PostgreSQL healthy before tidings, the
    // image built from this Dockerfile, the secret required.
    let script = "import sys, yaml, json; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))";
    let out = Command::new(python()).args(["-c", script]).arg(Path::new(ROOT).join("deploy/compose.yaml")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let compose: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tidings = &compose["services"]["tidings"];
    assert_eq!(tidings["build"]["dockerfile"], "deploy/Dockerfile");
    assert!(Path::new(ROOT).join("deploy").join(tidings["build"]["context"].as_str().unwrap()).join("deploy/Dockerfile").is_file());
    assert_eq!(tidings["depends_on"]["postgres"]["condition"], "service_healthy");
    assert!(tidings["environment"]["DATABASE_URL"].as_str().unwrap().contains("@postgres:5432/"));
    assert!(tidings["environment"]["TIDINGS_JWT_HS256_SECRET"].as_str().unwrap().starts_with("${TIDINGS_JWT_HS256_SECRET:?"));
    assert!(compose["services"]["postgres"]["healthcheck"]["test"].is_array());
}

/// The systemd unit is one systemd accepts (`systemd-analyze verify`, with
/// the binary this build made in place of the installed one) and confines
/// the service: no capabilities, devices, foreign address families or
/// privileged system calls.
#[test]
fn the_systemd_unit_verifies_and_confines() {
    let unit = std::fs::read_to_string(Path::new(ROOT).join("deploy/tidings.service")).unwrap();
    for needed in [
        "CapabilityBoundingSet=\n",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
        "PrivateDevices=yes",
    ] {
        assert!(unit.contains(needed), "tidings.service has {needed}");
    }
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("tidings.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/tidings", env!("CARGO_BIN_EXE_tidings"))).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().expect("systemd-analyze (scripts/test installs systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/tidings", env!("CARGO_BIN_EXE_tidings")).replace("PrivateDevices=yes", "PrivateDevices=maybe"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).is_empty(), "a broken unit is reported");
}
