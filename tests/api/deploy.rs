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
