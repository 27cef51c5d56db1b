//! Writes the committed seed corpora, `fuzz/seeds/<target>/`, from the project's own valid examples: the
//! example fleet under `deploy/examples/fleet`, its bundle, pointers and heartbeats signed with the fixed test
//! keys of `windvane_fuzz`, and typical HTTP requests. Each seed starts with the mode byte its target reads.
//!
//! Run from the repository root: `cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds`. Seeds only
//! change when formats change; the fuzzers' own findings go to `fuzz/corpus/` (not committed).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;
use windvane_fuzz::{CHANNEL, CLUSTER, FLEET, HIGHEST_ACCEPTED, cluster_key, now, release_key};
use windvane_shared::format::bundle::BundleLimits;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::dsse;
use windvane_shared::wire::heartbeat::HEARTBEAT_PAYLOAD_TYPE;
use windvane_shared::crypto::keys::verifying_key_to_pem;
use windvane_shared::format::release::{BundleRef, RELEASE_PAYLOAD_TYPE, ReleasePointer};
use windvane_publisher::source::load_fleet_dir;

fn main() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = fuzz.parent().expect("fuzz/ is inside the repository");
    let seeds = fuzz.join("seeds");
    let example = repo.join("deploy/examples/fleet");
    let _ = fs::remove_dir_all(&seeds);

    // The example fleet, as files and as a bundle.
    let bundle =
        load_fleet_dir(&example, BundleLimits::default()).expect("the example fleet loads");
    assert_eq!(
        bundle.fleet, FLEET,
        "the fixed fleet name follows the example fleet"
    );
    let bundle_bytes = bundle.to_json_bytes();
    let fleet_yaml = read(&example.join("fleet.yaml"));
    let api = concat_documents(&example.join("apps/api"));
    let monitoring = concat_documents(&example.join("apps/monitoring"));

    // Pointers.
    let pointer = |serial: u64, sha256: String, hours: i64| ReleasePointer {
        fleet: FLEET.to_owned(),
        channel: CHANNEL.to_owned(),
        serial,
        issued_at: now() - jiff::SignedDuration::from_mins(1),
        expires_at: now() + jiff::SignedDuration::from_hours(hours),
        bundle: BundleRef {
            sha256,
            size: bundle_bytes.len() as u64,
        },
        allow_empty: false,
        rollout: None,
    };
    let current = pointer(HIGHEST_ACCEPTED + 1, sha256_hex(&bundle_bytes), 24 * 7);
    let same_serial = pointer(
        HIGHEST_ACCEPTED,
        sha256_hex(b"the bundle accepted at serial 3"),
        24,
    );
    let expired = pointer(HIGHEST_ACCEPTED + 2, sha256_hex(&bundle_bytes), -1);
    let signed_pointer = current.sign(&release_key()).to_json_bytes();
    let pointer_json = serde_json::to_vec(&current).expect("json");

    // Heartbeats and enrolment.
    let heartbeat = json!({
        "cluster": CLUSTER,
        "fleet": FLEET,
        "sequence": 42,
        "sentAt": now().to_string(),
        "intervalSeconds": 30,
        "agentVersion": "0.1.0",
        "labels": {"env": "prod", "region": "eu"},
        "state": "OutOfSync",
        "source": {
            "channel": CHANNEL,
            "appliedSerial": 4,
            "appliedSha256": sha256_hex(&bundle_bytes),
            "lastRefusal": {"reason": "expired", "message": "pointer expired", "at": now().to_string()},
        },
        "counts": {"Synced": 5, "OutOfSync": 1},
        "apps": [{"name": "api", "state": "OutOfSync", "objects": 3}],
        "problems": [{
            "app": "api", "object": "Deployment api/api", "group": "apps", "kind": "Deployment",
            "state": "OutOfSync", "message": "drift on /spec/template",
        }],
        "drift": [{
            "app": "api", "group": "apps", "kind": "Deployment", "namespace": "api", "name": "api",
            "fields": ["/spec/template/spec/containers/0/image"], "deleted": false,
            "manager": "kubectl-edit", "operation": "Update", "changedAt": now().to_string(),
            "detectedAt": now().to_string(), "revertedAt": now().to_string(), "action": "Reverted",
        }],
        "lastError": "<b>apply failed</b> & retried",
    });
    let heartbeat_payload = serde_json::to_vec(&heartbeat).expect("json");
    let heartbeat_body =
        dsse::sign(HEARTBEAT_PAYLOAD_TYPE, &heartbeat_payload, &cluster_key()).to_json_bytes();
    let enroll = serde_json::to_vec(&json!({
        "token": "registration-token",
        "fleet": FLEET,
        "publicKey": verifying_key_to_pem(&cluster_key().verifying_key()),
        "labels": {"env": "prod", "region": "eu"},
    }))
    .expect("json");

    write(&seeds, "dsse_envelope", "pointer", 0, &signed_pointer);
    write(&seeds, "dsse_envelope", "heartbeat", 0, &heartbeat_body);
    write(
        &seeds,
        "dsse_envelope",
        "sign-release",
        1,
        &[RELEASE_PAYLOAD_TYPE.as_bytes(), b"\0", &pointer_json].concat(),
    );
    write(
        &seeds,
        "dsse_envelope",
        "sign-other",
        1,
        b"text/plain\0hello world",
    );

    write(&seeds, "release_pointer", "current", 0, &signed_pointer);
    write(
        &seeds,
        "release_pointer",
        "expired",
        0,
        &expired.sign(&release_key()).to_json_bytes(),
    );
    write(
        &seeds,
        "release_pointer",
        "payload-current",
        1,
        &pointer_json,
    );
    write(
        &seeds,
        "release_pointer",
        "payload-same-serial",
        1,
        &serde_json::to_vec(&same_serial).expect("json"),
    );

    write(&seeds, "bundle", "example", 0, &bundle_bytes);
    write(&seeds, "bundle", "example-bound", 1, &bundle_bytes);

    write(&seeds, "yaml", "fleet", 0, fleet_yaml.as_bytes());
    write(&seeds, "yaml", "api", 0, api.as_bytes());
    write(&seeds, "yaml", "monitoring", 0, monitoring.as_bytes());
    write(&seeds, "yaml", "features", 0, YAML_FEATURES.as_bytes());
    write(&seeds, "yaml", "bundle-json", 1, &bundle_bytes);
    write(&seeds, "yaml", "heartbeat-json", 1, &heartbeat_payload);

    let fleet_with_web = format!("{fleet_yaml}\n  - name: web\n    path: apps/web\n");
    write_raw(
        &seeds,
        "fleet_source",
        "example",
        &[
            fleet_with_web.as_bytes(),
            b"\0",
            api.as_bytes(),
            b"\0",
            monitoring.as_bytes(),
            b"\0",
            WEB_JSON.as_bytes(),
        ]
        .concat(),
    );

    write(&seeds, "heartbeat", "signed", 0, &heartbeat_body);
    write(&seeds, "heartbeat", "payload", 1, &heartbeat_payload);
    write(&seeds, "heartbeat", "enroll", 2, &enroll);

    let http = |name: &str, request: Vec<u8>| write_raw(&seeds, "http_request", name, &request);
    let digest = sha256_hex(&bundle_bytes);
    http(
        "pointer",
        b"GET /channels/stable.json HTTP/1.1\r\nHost: store\r\nIf-None-Match: W/\"abc\", \"x\"\r\n\
          Accept-Encoding: br, gzip;q=0.5\r\n\r\n"
            .to_vec(),
    );
    http(
        "bundle-head",
        format!(
            "HEAD /bundles/{digest}.json HTTP/1.1\r\nHost: store\r\nAccept-Encoding: *\r\n\r\n"
        )
        .into_bytes(),
    );
    http(
        "page",
        b"GET /?selector=env%3Dprod%2Cregion+in+%28eu%2Cus%29%2C%21legacy&state=Unknown,Failed HTTP/1.1\r\n\
          Host: fleet\r\nAuthorization: Basic dXNlcjpyZWFkLXRva2Vu\r\n\r\n"
            .to_vec(),
    );
    http(
        "api",
        b"GET /api/v1/clusters?selector=tier+notin+%28db%29%2Cgpu HTTP/1.1\r\nHost: fleet\r\n\
          Authorization: Bearer read-token\r\n\r\nGET /api/v1/drift?since=1h30m&cluster=prod-eu-1 HTTP/1.1\r\n\
          Host: fleet\r\n\r\nGET /clusters/prod-eu-1 HTTP/1.1\r\nHost: fleet\r\n\r\n"
            .to_vec(),
    );
    http(
        "heartbeat",
        [
            format!(
                "POST /api/v1/clusters/{CLUSTER}/heartbeat HTTP/1.1\r\nHost: fleet\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                heartbeat_body.len()
            )
            .as_bytes(),
            &heartbeat_body,
        ]
        .concat(),
    );
    http(
        "enroll",
        [
            format!(
                "POST /api/v1/clusters/{CLUSTER}/enroll HTTP/1.1\r\nHost: fleet\r\n\
                 Transfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                enroll.len()
            )
            .as_bytes(),
            &enroll,
            b"\r\n0\r\n\r\n",
        ]
        .concat(),
    );
    http(
        "odd",
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\nGET /channels/%2e%2e/x.json HTTP/1.0\r\n\r\n\
          POST /api/v1/clusters/a/forget HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: 0\r\n\r\n"
            .to_vec(),
    );
    println!("seeds written to {}", seeds.display());
}

/// YAML that exercises the reader's rules: anchors and aliases, tags, block and flow styles, quoting, several
/// documents, and the YAML 1.1 look-alikes that are valid when quoted.
const YAML_FEATURES: &str = r#"# a comment
apiVersion: v1
kind: ConfigMap
metadata: &meta
  name: demo
  namespace: "demo"
  labels: {app: demo, tier: 'web'}
data:
  mode: "0644"
  flag: "on"
  hex: !!str 0x1F
  script: |
    echo "${values.greeting}"
    exit 0
  folded: >-
    one
    two
  empty: ""
  nested: *meta
list: [1, -2, 0o17, 0x1f, 1.5, 2.0e3, true, null, ~]
typed: !!int 42
---
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Secret
    metadata: {name: s}
    stringData: {k: v}
...
"#;

const WEB_JSON: &str = r#"{"apiVersion": "v1", "kind": "ConfigMap",
 "metadata": {"name": "web", "namespace": "web", "labels": {"zone": "${cluster.labels.topology.kubernetes.io/zone}"}},
 "data": {"cluster": "${cluster.name}", "literal": "$${not}", "n": 1.0}}"#;

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every YAML file of an app directory, as one multi-document stream.
fn concat_documents(dir: &Path) -> String {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read app dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| read(file))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A seed for a target that reads a mode byte first.
fn write(seeds: &Path, target: &str, name: &str, mode: u8, body: &[u8]) {
    write_raw(seeds, target, name, &[&[mode][..], body].concat());
}

/// A seed for a target without a mode byte.
fn write_raw(seeds: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = seeds.join(target);
    fs::create_dir_all(&dir).expect("mkdir");
    fs::write(dir.join(name), bytes).expect("write seed");
}
