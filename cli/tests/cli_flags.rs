//! Every verb's command line, pinned: the verbs, and for each the usage line (which flags are required),
//! every flag with its value name, `WINDVANE_…` environment fallback, default and possible values, as
//! `windvane <verb> --help` shows them. Scripts, CI jobs and the deploy manifests outside this repository
//! call these flags and set these variables: a refactoring of the argument structs must not rename, drop or
//! re-default one. The pins were taken from the binary before the argument groups were shared
//! (`#[command(flatten)]`); a flag added later is added here on purpose.

use std::process::Command;

/// `windvane ARGS --help` with no `WINDVANE_…` variable set (help shows a set variable's value).
fn help(args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_windvane"));
    command.args(args).arg("--help");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WINDVANE_") {
            command.env_remove(name);
        }
    }
    let out = command.output().expect("windvane runs");
    assert!(out.status.success(), "windvane {args:?} --help failed");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The entries of one section (`Options:`, `Arguments:`, `Commands:`), each with its wrapped lines joined.
fn section(help: &str, title: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if !line.starts_with(' ') {
            inside = line == title;
            continue;
        }
        if !inside {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        // An entry starts at the left (two to six spaces); its help wraps onto lines indented further.
        if indent <= 6 || entries.is_empty() {
            entries.push(line.trim().to_owned());
        } else if let Some(last) = entries.last_mut() {
            last.push(' ');
            last.push_str(line.trim());
        }
    }
    entries
}

/// The bracketed annotation `[name: …]` of an entry, if any.
fn annotation(entry: &str, name: &str) -> Option<String> {
    let start = entry.find(&format!("[{name}: "))?;
    let end = start + entry[start..].find(']')?;
    Some(entry[start..=end].to_owned())
}

/// One option or argument as pinned: its flags and value name (the entry up to its help), then its
/// environment variable, default and possible values.
fn canonical(entry: &str) -> String {
    let head = entry.split("  ").next().unwrap_or(entry).trim();
    let mut out = head.to_owned();
    for name in ["env", "default", "possible values"] {
        if let Some(found) = annotation(entry, name) {
            out.push(' ');
            out.push_str(&found);
        }
    }
    out
}

/// The usage line, the arguments and the options of `windvane ARGS`, one per line (options sorted, so that
/// moving a flag into a shared group does not count as a change, while renaming or dropping it does).
fn surface(args: &[&str]) -> String {
    let text = help(args);
    let usage = text
        .lines()
        .find_map(|l| l.strip_prefix("Usage: "))
        .expect("a usage line");
    let mut lines = vec![format!("usage: {usage}")];
    lines.extend(section(&text, "Arguments:").iter().map(|e| canonical(e)));
    let mut options: Vec<String> = section(&text, "Options:")
        .iter()
        .map(|e| canonical(e))
        .collect();
    options.sort();
    lines.extend(options);
    lines.join("\n")
}

fn commands(args: &[&str]) -> Vec<String> {
    section(&help(args), "Commands:")
        .iter()
        .map(|e| e.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn every_verb_is_still_there() {
    assert_eq!(
        commands(&[]),
        [
            "keygen",
            "build",
            "publish",
            "verify",
            "render",
            "status",
            "cluster",
            "rollout",
            "rollback",
            "promote",
            "approve",
            "seal",
            "age-keygen",
            "get",
            "wait",
            "history",
            "version",
            "completion",
            "man",
            "help"
        ]
    );
    assert_eq!(
        commands(&["get"]),
        ["clusters", "cluster", "apps", "drift", "help"]
    );
    assert_eq!(commands(&["cluster"]), ["rekey", "forget", "help"]);
    assert_eq!(commands(&["rollout"]), ["status", "halt", "resume", "help"]);
}

#[test]
fn every_flag_env_and_default_is_still_there() {
    let mut changed = Vec::new();
    for (verb, pinned) in PINNED {
        let args: Vec<&str> = verb.split(' ').collect();
        let found = surface(&args);
        if found != pinned.trim() {
            changed.push(format!(
                "windvane {verb}:\n--- pinned\n{}\n--- now\n{found}",
                pinned.trim()
            ));
        }
    }
    assert!(changed.is_empty(), "{}", changed.join("\n\n"));
}

/// Taken from `windvane <verb> --help` of the binary before the refactoring (commit 39e8adb). Added since, on
/// purpose (issue 51, CLI conventions): `-o` as the short form of `status` and `rollout status`'s `--output`,
/// with `yaml` beside `table` and `json` (the long flag, its variable and default unchanged), and the same
/// `-o, --output` on `verify`; the verbs
/// `get`, `wait`, `history`, `version`, `completion` and `man`.
const PINNED: &[(&str, &str)] = &[
    (
        "keygen",
        r#"
usage: windvane keygen --out <PREFIX>
--out <PREFIX> [env: WINDVANE_KEY_PREFIX=]
-V, --version
-h, --help
"#,
    ),
    (
        "build",
        r#"
usage: windvane build [OPTIONS] --output <FILE> <SOURCE>
<SOURCE>
--engine-timeout <DURATION> [env: WINDVANE_ENGINE_TIMEOUT=] [default: 2m]
--helm <PATH> [env: WINDVANE_HELM=]
--kustomize <PATH> [env: WINDVANE_KUSTOMIZE=]
--kustomize-remote [env: WINDVANE_KUSTOMIZE_REMOTE=]
--strict [env: WINDVANE_STRICT=]
-V, --version
-h, --help
-o, --output <FILE>
"#,
    ),
    (
        "publish",
        r#"
usage: windvane publish [OPTIONS] --root <STORE> --channel <CHANNEL> --key <KEY> <SOURCE>
<SOURCE>
--allow-empty [env: WINDVANE_ALLOW_EMPTY=]
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--engine-timeout <DURATION> [env: WINDVANE_ENGINE_TIMEOUT=] [default: 2m]
--expires-in <DURATION> [env: WINDVANE_EXPIRES_IN=] [default: 30d]
--helm <PATH> [env: WINDVANE_HELM=]
--key <KEY> [env: WINDVANE_KEY=]
--kustomize <PATH> [env: WINDVANE_KUSTOMIZE=]
--kustomize-remote [env: WINDVANE_KUSTOMIZE_REMOTE=]
--root <STORE> [env: WINDVANE_ROOT=]
--strict [env: WINDVANE_STRICT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "verify",
        r#"
usage: windvane verify [OPTIONS]
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--root <DIR|S3|URL> [env: WINDVANE_ROOT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "render",
        r#"
usage: windvane render [OPTIONS] --cluster <NAME> [SOURCE]
[SOURCE]
--age-key-file <FILE> [env: WINDVANE_AGE_KEY_FILE=]
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--cluster <NAME> [env: WINDVANE_CLUSTER=]
--engine-timeout <DURATION> [env: WINDVANE_ENGINE_TIMEOUT=] [default: 2m]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--helm <PATH> [env: WINDVANE_HELM=]
--kustomize <PATH> [env: WINDVANE_KUSTOMIZE=]
--kustomize-remote [env: WINDVANE_KUSTOMIZE_REMOTE=]
--label <KEY=VALUE>
--reveal
--root <DIR|S3|URL> [env: WINDVANE_ROOT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "status",
        r#"
usage: windvane status [OPTIONS] --server <URL>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--selector <SEL> [env: WINDVANE_SELECTOR=]
--server <URL> [env: WINDVANE_SERVER=]
--state <STATE> [env: WINDVANE_STATE=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "cluster rekey",
        r#"
usage: windvane cluster rekey --server <URL> --admin-token-file <FILE> <NAME>
<NAME>
--admin-token-file <FILE> [env: WINDVANE_ADMIN_TOKEN_FILE=]
--server <URL> [env: WINDVANE_SERVER=]
-V, --version
-h, --help
"#,
    ),
    (
        "cluster forget",
        r#"
usage: windvane cluster forget --server <URL> --admin-token-file <FILE> <NAME>
<NAME>
--admin-token-file <FILE> [env: WINDVANE_ADMIN_TOKEN_FILE=]
--server <URL> [env: WINDVANE_SERVER=]
-V, --version
-h, --help
"#,
    ),
    (
        "rollout status",
        r#"
usage: windvane rollout status [OPTIONS] --server <URL> --channel <CHANNEL>
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--server <URL> [env: WINDVANE_SERVER=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "rollout halt",
        r#"
usage: windvane rollout halt [OPTIONS] --root <STORE> --channel <CHANNEL> --key <KEY>
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--key <KEY> [env: WINDVANE_KEY=]
--root <STORE> [env: WINDVANE_ROOT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "rollout resume",
        r#"
usage: windvane rollout resume [OPTIONS] --root <STORE> --channel <CHANNEL> --key <KEY>
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--key <KEY> [env: WINDVANE_KEY=]
--root <STORE> [env: WINDVANE_ROOT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "rollback",
        r#"
usage: windvane rollback [OPTIONS] --root <STORE> --channel <CHANNEL> --key <KEY>
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--dry-run
--expires-in <DURATION> [env: WINDVANE_EXPIRES_IN=] [default: 30d]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--key <KEY> [env: WINDVANE_KEY=]
--root <STORE> [env: WINDVANE_ROOT=]
--to <SERIAL>
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "promote",
        r#"
usage: windvane promote [OPTIONS] --root <STORE> --from <CHANNEL> --to <CHANNEL> --key <KEY>
--expires-in <DURATION> [env: WINDVANE_EXPIRES_IN=] [default: 30d]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--from <CHANNEL>
--key <KEY> [env: WINDVANE_KEY=]
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--require-synced <SEL>
--root <STORE> [env: WINDVANE_ROOT=]
--server <URL> [env: WINDVANE_SERVER=]
--to <CHANNEL>
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "approve",
        r#"
usage: windvane approve [OPTIONS] --root <STORE> --channel <CHANNEL> --serial <N> --key <KEY> --trusted-key <PUB>
--channel <CHANNEL> [env: WINDVANE_CHANNEL=]
--fleet <FLEET> [env: WINDVANE_FLEET=]
--key <KEY> [env: WINDVANE_APPROVER_KEY_FILE=]
--root <STORE> [env: WINDVANE_ROOT=]
--serial <N>
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
"#,
    ),
    (
        "seal",
        r#"
usage: windvane seal [OPTIONS] <FILE>
<FILE>
--in-place
--namespace <NS>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--recipient <AGE1>
--recipients <FILE> [env: WINDVANE_RECIPIENTS=]
--server <URL> [env: WINDVANE_SERVER=]
--to <NAME>
--to-cluster <CLUSTER[=KEYID]>
-V, --version
-h, --help
-o, --output <OUT>
"#,
    ),
    (
        "age-keygen",
        r#"
usage: windvane age-keygen --output <FILE>
-V, --version
-h, --help
-o, --output <FILE>
"#,
    ),
    (
        "get clusters",
        r#"
usage: windvane get clusters [OPTIONS] --server <URL>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--selector <SEL> [env: WINDVANE_SELECTOR=]
--server <URL> [env: WINDVANE_SERVER=]
--state <STATE> [env: WINDVANE_STATE=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "get cluster",
        r#"
usage: windvane get cluster [OPTIONS] --server <URL> <NAME>
<NAME>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--server <URL> [env: WINDVANE_SERVER=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "get apps",
        r#"
usage: windvane get apps [OPTIONS] --server <URL>
--cluster <NAME>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--selector <SEL> [env: WINDVANE_SELECTOR=]
--server <URL> [env: WINDVANE_SERVER=]
--state <STATE> [env: WINDVANE_STATE=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "get drift",
        r#"
usage: windvane get drift [OPTIONS] --server <URL>
--cluster <NAME>
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--selector <SEL> [env: WINDVANE_SELECTOR=]
--server <URL> [env: WINDVANE_SERVER=]
--since <DURATION|TIME> [env: WINDVANE_SINCE=]
--state <STATE> [env: WINDVANE_STATE=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "wait",
        r#"
usage: windvane wait [OPTIONS] --server <URL> --for <CONDITION>
--for <CONDITION> [env: WINDVANE_WAIT_FOR=] [possible values: synced, healthy]
--interval <DURATION> [env: WINDVANE_WAIT_INTERVAL=] [default: 2s]
--read-token-file <FILE> [env: WINDVANE_READ_TOKEN_FILE=]
--selector <SEL> [env: WINDVANE_SELECTOR=]
--server <URL> [env: WINDVANE_SERVER=]
--timeout <DURATION> [env: WINDVANE_WAIT_TIMEOUT=] [default: 5m]
-V, --version
-h, --help
"#,
    ),
    (
        "history",
        r#"
usage: windvane history [OPTIONS] --root <DIR|S3|URL> <CHANNEL>
<CHANNEL>
--limit <N> [default: 50]
--root <DIR|S3|URL> [env: WINDVANE_ROOT=]
--trusted-key <PUB> [env: WINDVANE_TRUSTED_KEYS=]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "version",
        r#"
usage: windvane version [OPTIONS]
-V, --version
-h, --help
-o, --output <OUTPUT> [env: WINDVANE_OUTPUT=] [default: table] [possible values: table, json, yaml]
"#,
    ),
    (
        "completion",
        r#"
usage: windvane completion <SHELL>
<SHELL> [possible values: bash, elvish, fish, powershell, zsh]
-V, --version
-h, --help
"#,
    ),
    (
        "man",
        r#"
usage: windvane man --dir <DIR>
--dir <DIR>
-V, --version
-h, --help
"#,
    ),
];
