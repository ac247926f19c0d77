"""Validates the Kubernetes manifests in a directory (deploy/k8s), offline.

Core objects (Deployment, Service, PodDisruptionBudget, ...) are checked by
kubernetes-validate against the schemas of a Kubernetes version, strictly
(unknown fields fail). A CloudNativePG Cluster is checked against the v1
schema of the operator's own CRD, vendored in schemas/, made strict the same
way: where the schema lists properties and does not keep unknown fields, no
other field is allowed (what the API server would prune, a typo, fails).

Usage: validate-k8s.py DIR [KUBERNETES_VERSION]; exit status 1 on the first
manifest that does not validate, with every error printed.
"""

from __future__ import annotations

import copy
import pathlib
import sys
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # untyped: no stubs published
import yaml

CRD = "schemas/postgresql.cnpg.io_clusters.yaml"


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever it lists
    properties, keeps no unknown fields and allows no other map."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields", False)
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def cluster_schema(root: pathlib.Path) -> dict[str, Any]:
    crd = yaml.safe_load((root / CRD).read_text())
    for version in crd["spec"]["versions"]:
        if version["name"] == "v1":
            schema: dict[str, Any] = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
            return schema
    raise SystemExit(f"{CRD} has no v1 schema")


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1])
    version = argv[2] if len(argv) > 2 else "1.37.0"
    cluster = jsonschema.Draft7Validator(cluster_schema(root))
    failed = 0
    checked = 0
    for path in sorted(root.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            checked += 1
            name = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if doc.get("apiVersion") == "postgresql.cnpg.io/v1" and doc.get("kind") == "Cluster":
                errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in cluster.iter_errors(doc)]
            else:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                    errors = []
                except kubernetes_validate.ValidationError as e:
                    errors = [f"{'/'.join(map(str, e.path))}: {e.message}"]
                except kubernetes_validate.SchemaNotFoundError as e:
                    errors = [f"no schema: {e}"]
            for error in errors:
                print(f"{name}: {error}", file=sys.stderr)
            failed += bool(errors)
            if not errors:
                print(f"{name}: valid")
    if checked == 0:
        print(f"no manifests in {root}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
