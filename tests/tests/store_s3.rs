//! Object storage as the store: `windvane publish --root s3://…` into a real S3-protocol server (SeaweedFS),
//! agents polling the bucket directly over HTTP (ETags and 304s, no Windvane server in between), a second
//! release and a rollback visible to them, and of two publishers of the same serial exactly one wins — the
//! other is told so and changes nothing. The other store commands (`render --root`, `rollout halt|resume`,
//! `approve`, `promote`) run against the bucket too, each checked by reading back what it wrote.

mod fault_support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fault_support::{SYNC, config_map, data};
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::crypto::keys::{TrustedKeys, signing_key_from_seed};
use windvane_shared::decide::approval::{self, ApprovalStatement, approval_path};
use windvane_shared::format::bundle::{Bundle, BundleLimits};
use windvane_shared::format::release::{
    DEFAULT_MAX_POINTER_BYTES, ReleasePointer, verify_signed_pointer,
};
use windvane_store::{self as store, PublishRequest, Store};
use windvane_tests::fleet::{Agent, AgentOptions, FleetTree, Publisher, metric};
use windvane_tests::localkube::LocalKube;
use windvane_tests::poll::wait_for;
use windvane_tests::process::binary;
use windvane_tests::s3::S3Server;

fn release(tree: &FleetTree, version: &str) -> anyhow::Result<()> {
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\n",
    )?;
    tree.write(
        "web/config.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: web, namespace: default}}\ndata: {{version: \"{version}\"}}\n"
        ),
    )?;
    Ok(())
}

/// Runs the real `windvane` with the S3 server's publisher credentials in its environment.
fn windvane(s3: &S3Server, args: &[&str]) -> Output {
    Command::new(binary("windvane").expect("the windvane binary"))
        .args(args)
        .envs(s3.publisher_env())
        .output()
        .expect("run windvane")
}

fn succeeded(output: &Output) -> bool {
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    }
    output.status.success()
}

/// A file of the store under `prefix`, as anyone may read it from the bucket over HTTP.
async fn bucket_file(s3: &S3Server, prefix: &str, relative: &str) -> anyhow::Result<Vec<u8>> {
    let url = format!("{}/{relative}", s3.http_url(prefix));
    let bytes = windvane_tests::http::client()
        .get(&url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(bytes.to_vec())
}

/// A channel's pointer as anyone may read it from the bucket, verified.
async fn channel_pointer(
    s3: &S3Server,
    prefix: &str,
    channel: &str,
    key: &TrustedKeys,
) -> anyhow::Result<ReleasePointer> {
    let bytes = bucket_file(s3, prefix, &store::channel_path(channel)).await?;
    Ok(verify_signed_pointer(&bytes, key, DEFAULT_MAX_POINTER_BYTES)?.pointer)
}

/// The `stable` channel's pointer, verified.
async fn pointer(s3: &S3Server, prefix: &str, key: &TrustedKeys) -> anyhow::Result<ReleasePointer> {
    channel_pointer(s3, prefix, "stable", key).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_converge_from_a_bucket_with_no_server_in_between() -> anyhow::Result<()> {
    let (s3, kube) = tokio::try_join!(S3Server::start(), LocalKube::start())?;
    let publisher = Publisher::new(61)?;
    let key = publisher.key_path()?;
    let key = key.to_str().expect("utf-8");
    let root = s3.store_url("prod");
    let tree = FleetTree::new()?;
    release(&tree, "1")?;
    let tree_path = tree.path().to_str().expect("utf-8");
    let publish = [
        "publish",
        tree_path,
        "--root",
        &root,
        "--channel",
        "stable",
        "--key",
        key,
    ];
    assert!(succeeded(&windvane(&s3, &publish)), "first publish");

    let mut options = AgentOptions::new(
        &s3.http_url("prod"),
        &publisher.public_key_path(),
        "prod-eu",
    );
    options.poll_interval = "1s".to_owned();
    let agent = Agent::start(&kube, &options).await?;
    agent
        .wait_status("release 1 Synced from the bucket", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 1
        })
        .await?;
    // The bucket answers the agent's If-None-Match with 304: polls cost no pointer download.
    wait_for("a 304 from the bucket", Duration::from_secs(30), || async {
        let metrics = agent.metrics().await?;
        let not_modified = metric(
            &metrics,
            "windvane_source_fetch_total{result=\"not_modified\"}",
        );
        Ok(not_modified.filter(|n| *n >= 2.0))
    })
    .await?;

    release(&tree, "2")?;
    assert!(succeeded(&windvane(&s3, &publish)), "second publish");
    wait_for("release 2 applied from the bucket", SYNC, || async {
        let cm = config_map(&kube, "default", "web").await?;
        Ok((data(cm.as_ref(), "version") == Some("2")).then_some(()))
    })
    .await?;

    let verify = windvane(
        &s3,
        &[
            "verify",
            "--root",
            &root,
            "--channel",
            "stable",
            "--trusted-key",
            publisher.public_key_path().to_str().expect("utf-8"),
        ],
    );
    assert!(succeeded(&verify), "verify from the bucket");
    assert!(String::from_utf8_lossy(&verify.stdout).contains("serial:   2"));

    // The history lives in the bucket too: a rollback brings release 1's bundle back as serial 3.
    let rollback = [
        "rollback",
        "--root",
        &root,
        "--channel",
        "stable",
        "--key",
        key,
    ];
    assert!(succeeded(&windvane(&s3, &rollback)), "rollback");
    wait_for("the rollback applied from the bucket", SYNC, || async {
        let cm = config_map(&kube, "default", "web").await?;
        Ok((data(cm.as_ref(), "version") == Some("1")).then_some(()))
    })
    .await?;
    agent
        .wait_status("serial 3 Synced", SYNC, |s| {
            s["state"] == "Synced" && s["source"]["appliedSerial"] == 3
        })
        .await?;
    Ok(())
}

/// A release that rolls out in two waves and needs one approval, so that halt, resume and approve apply.
fn gated_release(tree: &FleetTree) -> anyhow::Result<()> {
    release(tree, "gated")?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: web\n    path: web\nrollout:\n  waves:\n    - name: canary\n      \
         selector: {matchLabels: {tier: canary}}\n      soak: 1m\n    - name: rest\n  approval: {threshold: 1}\n",
    )?;
    Ok(())
}

fn failed_saying(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "succeeded, expected: {expected}");
    assert!(stderr.contains(expected), "{stderr}");
}

/// The store commands besides publish, verify and rollback, each the real `windvane` with an `s3://` root:
/// `render --root` renders what the tree renders, `rollout halt|resume` re-sign the pointer in the bucket,
/// `approve` writes (and a second approver adds to) the approval file, `promote` moves the exact digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_command_takes_a_bucket_as_its_root() -> anyhow::Result<()> {
    let s3 = S3Server::start().await?;
    let publisher = Publisher::new(64)?;
    let release_key = publisher.key_path()?;
    let release_key = release_key.to_str().expect("utf-8");
    let release_pub = publisher.public_key_path();
    let release_pub = release_pub.to_str().expect("utf-8");
    let mut trusted = TrustedKeys::new();
    let publisher_keyid = trusted.insert(signing_key_from_seed([64; 32]).verifying_key())?;
    let root = s3.store_url("cmds");
    let tree = FleetTree::new()?;
    gated_release(&tree)?;
    let tree_path = tree.path().to_str().expect("utf-8");
    let publish = [
        "publish",
        tree_path,
        "--root",
        &root,
        "--channel",
        "staging",
        "--key",
        release_key,
    ];
    assert!(succeeded(&windvane(&s3, &publish)), "publish to staging");
    let first = channel_pointer(&s3, "cmds", "staging", &trusted).await?;

    // render --root: the bucket's release, verified, renders byte for byte as the tree it came from.
    let cluster = ["--cluster", "eu-1", "--label", "tier=canary"];
    let local = windvane(&s3, &[&["render", tree_path][..], &cluster].concat());
    let from_bucket = [
        "render",
        "--root",
        &root,
        "--channel",
        "staging",
        "--trusted-key",
        release_pub,
    ];
    let remote = windvane(&s3, &[&from_bucket[..], &cluster].concat());
    assert!(succeeded(&local), "render of the tree");
    assert!(succeeded(&remote), "render --root of the bucket");
    let rendered = String::from_utf8_lossy(&remote.stdout);
    assert!(rendered.contains("version: gated"), "{rendered}");
    assert_eq!(
        rendered,
        String::from_utf8_lossy(&local.stdout),
        "render --root s3://… differs from the tree's render"
    );

    // rollout halt, then resume: the pointer in the bucket is re-signed (same serial and bundle) each time.
    let sign = |action: &str, channel: &str| {
        windvane(
            &s3,
            &[
                "rollout",
                action,
                "--root",
                &root,
                "--channel",
                channel,
                "--key",
                release_key,
            ],
        )
    };
    for (action, halted, control) in [("halt", true, 1), ("resume", false, 2)] {
        assert!(succeeded(&sign(action, "staging")), "rollout {action}");
        let current = channel_pointer(&s3, "cmds", "staging", &trusted).await?;
        let rollout = current.rollout.as_ref().expect("the release's rollout");
        assert_eq!(
            (rollout.halted, rollout.control),
            (halted, control),
            "after {action}"
        );
        assert_eq!(current.serial, first.serial);
        assert_eq!(current.bundle.sha256, first.bundle.sha256);
    }
    failed_saying(
        &sign("resume", "staging"),
        "channel \"staging\" serial 1 is already running",
    );
    failed_saying(
        &sign("halt", "canary"),
        "s3://fleet/cmds: no release published on channel \"canary\"",
    );

    // approve: the approval file lands in the bucket and counts; a second approver adds to it.
    let approvers = [Publisher::new(65)?, Publisher::new(66)?];
    let mut approver_keys = TrustedKeys::new();
    let mut approved = std::collections::BTreeSet::new();
    for (seed, approver) in [65, 66].into_iter().zip(&approvers) {
        let key = approver.key_path()?;
        let approve = windvane(
            &s3,
            &[
                "approve",
                "--root",
                &root,
                "--channel",
                "staging",
                "--serial",
                "1",
                "--key",
                key.to_str().expect("utf-8"),
                "--trusted-key",
                release_pub,
            ],
        );
        assert!(succeeded(&approve), "approve with key {seed}");
        approved.insert(approver_keys.insert(signing_key_from_seed([seed; 32]).verifying_key())?);
        let current = channel_pointer(&s3, "cmds", "staging", &trusted).await?;
        let file = bucket_file(&s3, "cmds", &approval_path("staging", 1)).await?;
        let tally = approval::tally(
            &file,
            &approver_keys,
            &publisher_keyid,
            &ApprovalStatement::of(&current),
        );
        assert_eq!(tally.approved, approved, "refused: {:?}", tally.refused);
        let policy = current.rollout.and_then(|r| r.approval).expect("policy");
        assert!(tally.meets(&policy));
    }
    let own = windvane(
        &s3,
        &[
            "approve",
            "--root",
            &root,
            "--channel",
            "staging",
            "--serial",
            "1",
            "--key",
            release_key,
            "--trusted-key",
            release_pub,
        ],
    );
    assert!(
        !own.status.success(),
        "the publisher approved its own release"
    );

    // promote: prod's first serial carries staging's exact bundle digest, and that bundle is in the bucket.
    let promote = windvane(
        &s3,
        &[
            "promote",
            "--root",
            &root,
            "--from",
            "staging",
            "--to",
            "prod",
            "--key",
            release_key,
        ],
    );
    assert!(succeeded(&promote), "promote staging to prod");
    let promoted = channel_pointer(&s3, "cmds", "prod", &trusted).await?;
    assert_eq!((promoted.channel.as_str(), promoted.serial), ("prod", 1));
    assert_eq!(promoted.bundle.sha256, first.bundle.sha256);
    let bundle = bucket_file(&s3, "cmds", &store::bundle_path(&promoted.bundle.sha256)).await?;
    assert_eq!(sha256_hex(&bundle), promoted.bundle.sha256);
    failed_saying(
        &windvane(
            &s3,
            &[
                "promote",
                "--root",
                &root,
                "--from",
                "qa",
                "--to",
                "prod",
                "--key",
                release_key,
            ],
        ),
        "s3://fleet/cmds: no release published on channel \"qa\"",
    );
    Ok(())
}

fn bundle(version: &str) -> anyhow::Result<(FleetTree, Bundle)> {
    let tree = FleetTree::new()?;
    release(&tree, version)?;
    let bundle = windvane_publisher::source::load_fleet_dir(tree.path(), BundleLimits::default())?;
    Ok((tree, bundle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_publishers_of_one_serial_exactly_one_wins() -> anyhow::Result<()> {
    let s3 = S3Server::start().await?;
    let store = Store::parse_with(&s3.store_url("race"), &s3.publisher_config())?;
    let key = signing_key_from_seed([62; 32]);
    let mut trusted = TrustedKeys::new();
    trusted.insert(key.verifying_key())?;
    let nobody = TrustedKeys::new();
    let request = |bundle| PublishRequest {
        channel: "stable",
        bundle,
        key: &key,
        also_trusted: &nobody,
        expires_in: Duration::from_secs(3600),
        allow_empty: false,
        now: jiff::Timestamp::now(),
    };
    let (_a, a) = bundle("a")?;
    let (_b, b) = bundle("b")?;
    let (_c, c) = bundle("c")?;
    let (_d, d) = bundle("d")?;

    // A first release (If-None-Match: *) and a later one (If-Match on the ETag read), each raced by two
    // publishers that both read the channel before either wrote.
    for (serial, winner, loser) in [(1, &a, &b), (2, &c, &d)] {
        let (request_w, request_l) = (request(winner), request(loser));
        let won = store::prepare_publish(&store, &request_w).await?;
        let lost = store::prepare_publish(&store, &request_l).await?;
        assert_eq!(won.pointer().serial, serial);
        assert_eq!(lost.pointer().serial, serial);
        let lost_bundle = lost.pointer().bundle.sha256.clone();
        won.commit().await?;
        let refused = lost
            .commit()
            .await
            .expect_err("the second publisher of a serial loses");
        assert!(
            matches!(refused, store::Error::ChangedConcurrently { .. }),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("run the command again"),
            "{refused}"
        );
        let current = pointer(&s3, "race", &trusted).await?;
        assert_eq!(current.serial, serial);
        assert_ne!(
            current.bundle.sha256, lost_bundle,
            "the loser's pointer never landed"
        );
    }
    // The signed history holds the pointer that landed for each serial, never the loser's.
    for serial in 1..=2 {
        let entry = store::history::read_entry(&store, "stable", serial, &trusted)
            .await?
            .expect("a signed history entry per serial that landed");
        assert_eq!(entry.serial, serial);
    }
    assert!(
        store::history::read_entry(&store, "stable", 3, &trusted)
            .await?
            .is_none()
    );

    // Two real `windvane publish` processes at once: however they interleave, every one that says it
    // published got a serial of its own, and one that lost says so.
    let trees = [bundle("e")?.0, bundle("f")?.0];
    let key_dir = tempfile::tempdir()?;
    let key_path = key_dir.path().join("release.key");
    std::fs::write(
        &key_path,
        windvane_shared::crypto::keys::signing_key_to_pem(&key),
    )?;
    let root = s3.store_url("race");
    let runs: Vec<_> = trees
        .iter()
        .map(|tree| {
            Command::new(binary("windvane").expect("the windvane binary"))
                .args(["publish", tree.path().to_str().expect("utf-8")])
                .args(["--root", &root, "--channel", "stable", "--key"])
                .arg(&key_path)
                .envs(s3.publisher_env())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start windvane publish")
        })
        .collect();
    let outputs: Vec<Output> = runs
        .into_iter()
        .map(|child| child.wait_with_output().expect("windvane publish"))
        .collect();
    let published = outputs.iter().filter(|o| o.status.success()).count();
    for failed in outputs.iter().filter(|o| !o.status.success()) {
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert!(stderr.contains("changed by someone else"), "{stderr}");
    }
    assert!(published >= 1, "at least one concurrent publisher succeeds");
    assert_eq!(
        pointer(&s3, "race", &trusted).await?.serial,
        2 + published as u64,
        "each success is its own serial"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_a_profile_of_the_shared_files() -> anyhow::Result<()> {
    let s3 = S3Server::start().await?;
    let publisher = Publisher::new(63)?;
    let key = publisher.key_path()?;
    let (tree, _) = bundle("p")?;
    let files = tempfile::tempdir()?;
    let env = s3.publisher_env();
    let setting = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .expect(name)
    };
    let credentials = files.path().join("credentials");
    std::fs::write(
        &credentials,
        format!(
            "[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n[release]\n\
             aws_access_key_id = {}\naws_secret_access_key = {}\n",
            setting("AWS_ACCESS_KEY_ID"),
            setting("AWS_SECRET_ACCESS_KEY")
        ),
    )?;
    let config = files.path().join("config");
    std::fs::write(&config, "[profile release]\nregion = us-east-1\n")?;
    let publish = |profile: &str| {
        Command::new(binary("windvane").expect("the windvane binary"))
            .args(["publish", tree.path().to_str().expect("utf-8")])
            .args([
                "--root",
                &s3.store_url("profiles"),
                "--channel",
                "stable",
                "--key",
            ])
            .arg(&key)
            .env("AWS_ENDPOINT_URL", setting("AWS_ENDPOINT_URL"))
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_PROFILE", profile)
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_REGION")
            .output()
            .expect("run windvane")
    };
    let published = publish("release");
    assert!(
        succeeded(&published),
        "publish with the release profile's keys"
    );
    let missing = publish("staging");
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("AWS profile \"staging\": not found in"),
        "{stderr}"
    );
    // The default profile's wrong keys are refused by the server: the profile really was what signed.
    let refused = publish("default");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("403") || stderr.contains("InvalidAccessKeyId"),
        "{stderr}"
    );
    Ok(())
}
