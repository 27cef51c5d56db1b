//! Loading fleet source trees from disk: what `windvane build` reads, and what it refuses.

#![allow(
    clippy::result_large_err,
    reason = "the crate's one error type (error.rs) is large; boxing it is a crate-wide decision"
)]

use std::fs;
use std::path::Path;

use serde_json::json;
use tempfile::TempDir;
use windvane_publisher::prerender::NoEngines;
use windvane_publisher::source::{FLEET_FILE, LoadOptions, load_fleet_dir, load_fleet_source};
use windvane_shared::Error;
use windvane_shared::format::bundle::BundleLimits;

/// A fleet tree in a temporary directory, built file by file.
struct Tree {
    dir: TempDir,
}

impl Tree {
    fn new(fleet_yaml: &str) -> Self {
        let tree = Self {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        tree.write(FLEET_FILE, fleet_yaml);
        tree
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, relative: &str, text: &str) -> &Self {
        let path = self.root().join(relative);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, text).expect("write");
        self
    }

    fn load(&self) -> windvane_shared::Result<windvane_shared::format::bundle::Bundle> {
        load_fleet_dir(self.root(), BundleLimits::default())
    }

    fn error(&self) -> Error {
        match self.load() {
            Ok(bundle) => panic!("expected an error, got {} apps", bundle.apps.len()),
            Err(e) => e,
        }
    }
}

const ONE_APP: &str = "fleet: acme\napps:\n  - name: web\n    path: apps/web\n";

fn config_map(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n")
}

#[test]
fn a_good_tree_becomes_a_sorted_bundle() {
    let tree = Tree::new(
        "fleet: acme\napps:\n  - name: web\n    path: apps/web\n    selector: {matchLabels: {env: prod}}\n    \
         values: {replicas: 2}\n    policy: {prune: true, driftGracePeriod: 1m, ignoreDifferences: [{group: apps, \
         kind: Deployment, name: api, jsonPointers: [/spec/replicas]}]}\n  - name: base\n    path: ./apps/base/\n",
    );
    tree.write("apps/web/z.yaml", &config_map("z"))
        .write("apps/web/a.yml", &format!("{}---\n---\n{}", config_map("a1"), config_map("a3")))
        .write("apps/web/sub/b.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api, namespace: web}\nspec:\n  replicas: ${values.replicas}\n")
        .write("apps/web/c.json", r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "web"}}"#)
        .write("apps/web/list.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: s1}}\n- {apiVersion: v1, kind: Secret, metadata: {name: s2}}\n")
        .write("apps/web/README.md", "not a manifest")
        .write("apps/web/.git/config.yaml", "not: [a manifest")
        .write("apps/web/.hidden.yaml", "not: [a manifest")
        .write("apps/base/ns.yaml", "# only a comment\n---\n");
    let bundle = tree.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bundle.fleet, "acme");
    assert_eq!(bundle.apps.len(), 2);
    let web = &bundle.apps[0];
    assert_eq!(web.name, "web");
    let order: Vec<(&str, usize, &str)> = web
        .manifests
        .iter()
        .map(|m| {
            (
                m.file.as_str(),
                m.document,
                m.object["metadata"]["name"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            ("apps/web/a.yml", 0, "a1"),
            ("apps/web/a.yml", 2, "a3"),
            ("apps/web/c.json", 0, "web"),
            ("apps/web/list.yaml", 0, "s1"),
            ("apps/web/list.yaml", 0, "s2"),
            ("apps/web/sub/b.yaml", 0, "api"),
            ("apps/web/z.yaml", 0, "z"),
        ]
    );
    // Manifests are stored unrendered.
    assert_eq!(
        web.manifests[5].object["spec"]["replicas"],
        json!("${values.replicas}")
    );
    assert!(web.policy.prune && web.policy.self_heal);
    assert_eq!(web.selector.to_string(), "env=prod");
    assert!(bundle.apps[1].manifests.is_empty());
    // Same tree, same bytes: the digest of a release does not depend on the file system's order.
    let again = tree.load().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bundle.to_json_bytes(), again.to_json_bytes());
}

#[test]
fn missing_identity_fields_name_file_and_document() {
    for (text, missing) in [
        (
            "kind: ConfigMap\nmetadata: {name: a}\n",
            "missing apiVersion",
        ),
        ("apiVersion: v1\nmetadata: {name: a}\n", "missing kind"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: x}\n",
            "missing metadata.name",
        ),
        ("apiVersion: v1\nkind: ConfigMap\n", "missing metadata"),
    ] {
        let tree = Tree::new(ONE_APP);
        tree.write(
            "apps/web/cm.yaml",
            &format!("{}---\n{text}", config_map("ok")),
        );
        match tree.error() {
            Error::Manifest {
                file,
                document,
                detail,
            } => {
                assert_eq!((file.as_str(), document), ("apps/web/cm.yaml", 1));
                assert_eq!(detail, missing);
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn an_object_defined_twice_in_an_app_is_refused() {
    let tree = Tree::new(ONE_APP);
    tree.write("apps/web/a.yaml", &config_map("same"))
        .write("apps/web/b/c.yaml", &config_map("same"));
    match tree.error() {
        Error::DuplicateObject {
            app,
            object,
            first,
            second,
        } => {
            assert_eq!((app.as_str(), object.as_str()), ("web", "ConfigMap same"));
            assert_eq!(
                (first.as_str(), second.as_str()),
                ("apps/web/a.yaml document 0", "apps/web/b/c.yaml document 0")
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn a_kustomization_app_needs_engines_that_this_loader_does_not_have() {
    let tree = Tree::new(ONE_APP);
    tree.write("apps/web/kustomization.yaml", "resources: [a.yaml]\n")
        .write("apps/web/a.yaml", &config_map("a"));
    match tree.error() {
        Error::Engine { app, step, detail } => {
            assert_eq!(app, "web");
            assert_eq!(step, "kustomize build apps/web");
            assert!(detail.contains("windvane build"), "{detail}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn an_invalid_json_pointer_is_refused() {
    let tree = Tree::new(&format!(
        "{ONE_APP}    policy:\n      ignoreDifferences: [{{kind: Deployment, jsonPointers: [spec/replicas]}}]\n"
    ));
    tree.write("apps/web/a.yaml", &config_map("a"));
    assert!(
        matches!(tree.error(), Error::InvalidPointer { app, pointer, .. } if app == "web" && pointer == "spec/replicas")
    );
}

#[test]
fn an_invalid_selector_is_refused() {
    let tree = Tree::new(&format!(
        "{ONE_APP}    selector: {{matchLabels: {{\"bad key\": x}}}}\n"
    ));
    assert!(matches!(tree.error(), Error::InvalidSelector { context, .. } if context == "app web"));
}

/// Issue 43: `defaultMode: 0644` is read as kubectl reads it (420) with a warning naming file and line; the
/// strict reading refuses it.
#[test]
fn an_octal_looking_mode_is_read_as_kubectl_reads_it() {
    let tree = Tree::new(ONE_APP);
    tree.write(
        "apps/web/secret-volume.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes:\n    - name: s\n      secret:\n        \
         secretName: s\n        defaultMode: 0644\n",
    );
    let loaded = load_fleet_source(
        tree.root(),
        BundleLimits::default(),
        &NoEngines,
        LoadOptions::default(),
    )
    .expect("the tree loads");
    let object = &loaded.bundle.apps[0].manifests[0].object;
    assert_eq!(
        object.pointer("/spec/volumes/0/secret/defaultMode"),
        Some(&serde_json::json!(420))
    );
    let [warning] = loaded.warnings.as_slice() else {
        panic!("{:?}", loaded.warnings)
    };
    assert_eq!(
        (
            warning.file.as_str(),
            warning.line,
            warning.column,
            warning.value.as_str()
        ),
        ("apps/web/secret-volume.yaml", 9, 22, "0644")
    );
    let strict = LoadOptions { strict_yaml: true };
    match load_fleet_source(tree.root(), BundleLimits::default(), &NoEngines, strict) {
        Err(Error::AmbiguousYaml { file, line, .. }) => {
            assert_eq!((file.as_str(), line), ("apps/web/secret-volume.yaml", 9));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fleet_yaml_is_read_strictly() {
    let tree = Tree::new(
        "fleet: acme\napps:\n  - name: web\n    path: apps/web\n    policy: {selfHeal: true, prun: true}\n",
    );
    fs::create_dir_all(tree.root().join("apps/web")).expect("mkdir");
    match tree.error() {
        Error::FleetConfig {
            file,
            field,
            detail,
        } => {
            assert_eq!(
                (file.as_str(), field.as_str()),
                ("fleet.yaml", "apps[0].policy.prun")
            );
            assert!(detail.contains("did you mean prune?"), "{detail}");
        }
        other => panic!("{other}"),
    }
    // The 1.1/1.2 rules apply to fleet.yaml too.
    let tree = Tree::new(
        "fleet: acme\napps:\n  - name: web\n    path: apps/web\n    policy: {selfHeal: yes}\n",
    );
    assert!(
        matches!(tree.error(), Error::AmbiguousYaml { file, line: 5, .. } if file == "fleet.yaml")
    );
    let tree = Tree::new("fleet: acme\n---\nfleet: other\n");
    assert!(matches!(tree.error(), Error::Parse { .. }));
    let empty = tempfile::tempdir().expect("temp dir");
    assert!(matches!(
        load_fleet_dir(empty.path(), BundleLimits::default()),
        Err(Error::Io { .. })
    ));
}

#[test]
fn app_paths_must_stay_inside_the_root() {
    let outside = tempfile::tempdir().expect("temp dir");
    fs::write(outside.path().join("cm.yaml"), config_map("x")).expect("write");
    let absolute = outside.path().display().to_string();
    for path in [
        "../elsewhere",
        "apps/../../elsewhere",
        absolute.as_str(),
        "missing",
    ] {
        let tree = Tree::new(&format!(
            "fleet: acme\napps:\n  - name: web\n    path: {path:?}\n"
        ));
        match tree.error() {
            Error::FleetConfig { field, .. } => assert_eq!(field, "apps[0].path", "{path}"),
            other => panic!("{path}: {other}"),
        }
    }
}

#[cfg(unix)]
#[test]
fn symbolic_links_out_of_the_root_are_refused() {
    use std::os::unix::fs::symlink;

    let outside = tempfile::tempdir().expect("temp dir");
    fs::write(outside.path().join("cm.yaml"), config_map("x")).expect("write");

    // The app's directory itself is a link out.
    let tree = Tree::new(ONE_APP);
    fs::create_dir_all(tree.root().join("apps")).expect("mkdir");
    symlink(outside.path(), tree.root().join("apps/web")).expect("symlink");
    assert!(
        matches!(tree.error(), Error::FleetConfig { field, detail, .. }
        if field == "apps[0].path" && detail.contains("outside the fleet root"))
    );

    // A file inside the app's directory links out.
    let tree = Tree::new(ONE_APP);
    tree.write("apps/web/a.yaml", &config_map("a"));
    symlink(
        outside.path().join("cm.yaml"),
        tree.root().join("apps/web/b.yaml"),
    )
    .expect("symlink");
    assert!(
        matches!(tree.error(), Error::FleetConfig { detail, .. } if detail.contains("apps/web/b.yaml"))
    );

    // Links that stay inside are followed, and a loop is walked once.
    let tree = Tree::new(ONE_APP);
    tree.write("shared/cm.yaml", &config_map("shared"));
    fs::create_dir_all(tree.root().join("apps/web")).expect("mkdir");
    symlink(
        tree.root().join("shared"),
        tree.root().join("apps/web/shared"),
    )
    .expect("symlink");
    symlink(
        tree.root().join("apps/web"),
        tree.root().join("apps/web/loop"),
    )
    .expect("symlink");
    let bundle = tree.load().unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<&str> = bundle.apps[0]
        .manifests
        .iter()
        .map(|m| m.file.as_str())
        .collect();
    assert_eq!(files, vec!["apps/web/shared/cm.yaml"]);
}

#[test]
fn kustomization_below_a_plain_app_is_refused() {
    let tree = Tree::new(ONE_APP);
    tree.write("apps/web/a.yaml", &config_map("a")).write(
        "apps/web/overlay/kustomization.yaml",
        "resources: [../a.yaml]\n",
    );
    match tree.error() {
        Error::FleetConfig { field, detail, .. } => {
            assert_eq!(field, "apps[0].path");
            assert!(
                detail.contains("apps/web/overlay/kustomization.yaml"),
                "{detail}"
            );
            assert!(
                detail.contains("point the app's path: at its directory"),
                "{detail}"
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn oversized_files_are_refused() {
    let tree = Tree::new(ONE_APP);
    let big = format!(
        "{}data:\n  x: \"{}\"\n",
        config_map("big"),
        "x".repeat(9 << 20)
    );
    tree.write("apps/web/big.yaml", &big);
    match tree.error() {
        Error::Io { path, source } => {
            assert_eq!(path, Path::new("apps/web/big.yaml"));
            assert!(source.to_string().contains("8 MiB"), "{source}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn bundle_limits_apply() {
    let tree = Tree::new(ONE_APP);
    tree.write(
        "apps/web/a.yaml",
        &format!("{}---\n{}", config_map("a"), config_map("b")),
    );
    let limits = BundleLimits {
        max_apps: 10,
        max_objects: 1,
    };
    assert!(matches!(
        load_fleet_dir(tree.root(), limits),
        Err(Error::TooMany {
            what: "objects",
            ..
        })
    ));
}

#[test]
fn substitute_false_is_read_and_kept_out_of_bundles_that_do_not_use_it() {
    let tree = Tree::new(ONE_APP);
    tree.write("apps/web/cm.yaml", &config_map("web"));
    let default = tree.load().expect("loads");
    assert!(default.apps[0].substitute);
    let encoded = String::from_utf8(default.to_json_bytes()).expect("utf-8");
    assert!(!encoded.contains("substitute"), "{encoded}");

    tree.write(FLEET_FILE, &format!("{ONE_APP}    substitute: false\n"));
    let off = tree.load().expect("loads");
    assert!(!off.apps[0].substitute);
    let encoded = String::from_utf8(off.to_json_bytes()).expect("utf-8");
    assert!(encoded.contains("\"substitute\":false"), "{encoded}");

    tree.write(FLEET_FILE, &format!("{ONE_APP}    substitute: \"no\"\n"));
    let message = tree.error().to_string();
    assert!(message.contains("substitute"), "{message}");
}

#[test]
fn app_namespace_is_read_and_checked() {
    let tree = Tree::new(&format!(
        "{ONE_APP}    namespace: observability\n    createNamespace: true\n"
    ));
    tree.write("apps/web/cm.yaml", &config_map("web"));
    let bundle = tree.load().expect("loads");
    assert_eq!(bundle.apps[0].namespace.as_deref(), Some("observability"));
    assert!(bundle.apps[0].create_namespace);

    tree.write(FLEET_FILE, &format!("{ONE_APP}    namespace: Not_A_Name\n"));
    let message = tree.error().to_string();
    assert!(message.contains("app web: namespace"), "{message}");

    tree.write(FLEET_FILE, &format!("{ONE_APP}    createNamespace: true\n"));
    let message = tree.error().to_string();
    assert!(message.contains("needs a namespace"), "{message}");
}

#[test]
fn a_variable_nothing_defines_is_a_build_error() {
    let fleet = "fleet: acme\napps:\n  - name: web\n    path: apps/web\n    values: {a: 1}\n    \
                 customizations:\n      - selector: {matchLabels: {env: prod}}\n        values: {b: 2}\n";
    let tree = Tree::new(fleet);
    // Defined by the app's values, by one customization, or a label some cluster may carry: fine here.
    tree.write(
        "apps/web/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: 'cm-${cluster.labels.tier}'}\n\
         data: {a: '${values.a}', b: '${values.b}', grafana: '${datasource}'}\n",
    );
    tree.load().expect("every variable is defined somewhere");
    tree.write(
        "apps/web/more.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: more}\ndata: {c: '${values.c}'}\n",
    );
    let error = tree.error();
    assert_eq!(error.reason(), "render");
    let message = error.to_string();
    for part in [
        "app web",
        "apps/web/more.yaml",
        "ConfigMap more",
        "/data/c",
        "${values.c}",
        "any customization",
    ] {
        assert!(message.contains(part), "{part:?} missing in: {message}");
    }
}

/// `helm:` and `kustomize:` fields that cannot work are refused with the field that is wrong, before any
/// engine would run.
#[test]
fn engine_fields_that_cannot_work_name_their_field() {
    let cases = [
        (
            "fleet: acme\napps:\n  - name: web\n    helm: {repo: https://charts.example.com, chart: web}\n",
            "apps[0].helm.repo",
            "exact version",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: charts/web\n    helm: {chart: web}\n",
            "apps[0].helm.chart",
            "give repo: too",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: charts/web\n    helm: {digest: md5:abc}\n",
            "apps[0].helm.digest",
            "sha256:",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: charts/web\n    helm: {valuesFiles: [missing.yaml]}\n",
            "apps[0].helm.valuesFiles[0]",
            "no such file",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: apps/web\n    customizations:\n      - kustomize: apps/web\n",
            "apps[0].customizations[0].kustomize",
            "plain folder of manifests",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: charts/web\n    helm: {}\n    customizations:\n      - kustomize: apps/web\n",
            "apps[0].customizations[0].kustomize",
            "is a Helm chart",
        ),
        (
            "fleet: acme\napps:\n  - name: web\n    path: charts/web\n    helm: {}\n    customizations:\n      - {helm: {values: {a: 1}}, kustomize: x}\n",
            "apps[0].customizations[0].kustomize",
            "not both",
        ),
    ];
    for (fleet_yaml, expected_field, expected_detail) in cases {
        let tree = Tree::new(fleet_yaml);
        tree.write(
            "charts/web/Chart.yaml",
            "apiVersion: v2\nname: web\nversion: 1.0.0\n",
        )
        .write("apps/web/a.yaml", &config_map("a"));
        match tree.error() {
            Error::FleetConfig { field, detail, .. } => {
                assert_eq!(field, expected_field, "{fleet_yaml}");
                assert!(detail.contains(expected_detail), "{fleet_yaml}: {detail}");
            }
            other => panic!("{fleet_yaml}: {other}"),
        }
    }
}
