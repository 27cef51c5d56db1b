//! `windvane seal`: Secrets encrypted to the clusters they are for, as ordinary SOPS files in the fleet tree
//! (the real `sops` reads them too). The age identities that open them come from `windvane age-keygen`
//! (`keys.rs`) or from each cluster's agent (`--to-cluster`).
//!
//! Where the data comes from: a plain manifest file (a Secret, or any YAML whose `data`/`stringData` values
//! are secret) and the recipients: `--recipient age1…`, or names looked up in a recipients file kept in the
//! fleet tree (`--to NAME --recipients FILE`), which maps each cluster to the recipient of the identity
//! installed in it and each group (a selector's clusters) to the group key installed in all of them:
//!
//! ```yaml
//! clusters:
//!   eu-1: age1…        # the identity in cluster eu-1's age key Secret
//! groups:
//!   prod: age1…        # the group key, installed in every cluster of the prod group
//! ```
//!
//! Where it goes: the sealed file (`-o`, or over the input with `--in-place`), to be committed and published;
//! only `data` and `stringData` are encrypted, so the object's identity stays readable without a key.
//!
//! Every document is sealed with its namespace (`metadata.namespace`, or `--namespace`): the SOPS MAC covers
//! every value of the file, clear ones included, and an object's own namespace wins over its app's, so a
//! sealed file copied into another app still lands in the namespace it was sealed for, and a file whose
//! namespace was edited does not open. A document without a namespace is refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;
use windvane_shared::format::sops::{self, KUBERNETES_ENCRYPTED_REGEX};
use windvane_shared::text::yaml::{YamlLimits, documents_to_json};
use windvane_shared::text::yaml_out::to_yaml_string;

use crate::args::{OptionalServerArgs, ReadTokenArgs, reword};
use crate::error::{Error, Result};
use crate::inputs::{read_text, read_token_file};

#[derive(Debug, Args)]
#[command(mut_args(|a| reword(a, "server", "The source server the clusters of --to-cluster are enrolled at")))]
pub struct SealArgs {
    /// The plain manifest file to seal (every document of it, with one data key).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// An age recipient (age1…) that may open it; repeat for more.
    #[arg(long = "recipient", value_name = "AGE1")]
    recipients: Vec<String>,
    /// A cluster or group named in --recipients whose recipient may open it; repeat for more.
    #[arg(long = "to", value_name = "NAME", requires = "recipients_file")]
    to: Vec<String>,
    /// A cluster, enrolled at --server, whose own identity key may open it (only that cluster's agent holds
    /// the private key); repeat for more. `CLUSTER=KEYID` pins the key id (or a prefix of at least 16 hex
    /// digits) the agent logs at start: the server's answer must name that key.
    #[arg(
        long = "to-cluster",
        value_name = "CLUSTER[=KEYID]",
        requires = "server"
    )]
    to_cluster: Vec<String>,
    #[command(flatten)]
    server: OptionalServerArgs,
    #[command(flatten)]
    token: ReadTokenArgs,
    /// The recipients file (clusters: and groups: mapping names to age recipients).
    #[arg(long = "recipients", value_name = "FILE", env = "WINDVANE_RECIPIENTS")]
    recipients_file: Option<PathBuf>,
    /// Where to write the sealed file (`-` for standard output).
    #[arg(short, long, value_name = "OUT", required_unless_present = "in_place")]
    output: Option<PathBuf>,
    /// Replace FILE with its sealed form.
    #[arg(long, conflicts_with = "output")]
    in_place: bool,
    /// The namespace sealed with every document that names none (one that names another is refused).
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
}

pub fn seal(args: SealArgs) -> Result<()> {
    let shown = args.file.display().to_string();
    let documents = read_documents(&args.file, args.namespace.as_deref())?;
    let mut recipients = args.recipients.clone();
    if let Some(file) = &args.recipients_file {
        recipients.extend(named_recipients(file, &args.to)?);
    }
    recipients.extend(enrolled_recipients(&args)?);
    if recipients.is_empty() {
        return Err(Error::NoRecipients);
    }
    let parsed = recipients
        .iter()
        .map(|r| {
            sops::parse_recipient(r, "--recipient").map_err(|source| Error::Recipient {
                recipient: r.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let sealed = sops::seal(
        &documents,
        &parsed,
        KUBERNETES_ENCRYPTED_REGEX,
        &now,
        &shown,
    )
    .map_err(|source| Error::Seal {
        file: shown.clone(),
        source,
    })?;
    let mut out = String::new();
    for (index, document) in sealed.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        out.push_str(&to_yaml_string(document));
    }
    write_sealed(&args, &out)?;
    eprintln!(
        "sealed {shown} ({} document(s)) to {}",
        sealed.len(),
        recipients.join(", ")
    );
    Ok(())
}

/// The documents of the plain manifest `file`, each bound to its namespace ([`bind_namespace`]).
fn read_documents(file: &Path, namespace: Option<&str>) -> Result<Vec<Value>> {
    let shown = file.display().to_string();
    let text = read_text(file)?;
    let mut documents: Vec<Value> = documents_to_json(&text, &shown, YamlLimits::default())
        .map_err(|source| Error::ReadManifest {
            file: shown.clone(),
            source,
        })?
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    if documents.is_empty() {
        return Err(Error::NothingToSeal { file: shown });
    }
    for (index, document) in documents.iter_mut().enumerate() {
        bind_namespace(document, namespace).map_err(|source| Error::SealDocument {
            file: shown.clone(),
            document: index + 1,
            source: Box::new(source),
        })?;
    }
    Ok(documents)
}

/// Writes the sealed text over FILE (`--in-place`), to `-o FILE`, or to standard output (`-o -`).
fn write_sealed(args: &SealArgs, text: &str) -> Result<()> {
    let target = if args.in_place {
        Some(args.file.clone())
    } else {
        args.output.clone().filter(|p| p.as_os_str() != "-")
    };
    match target {
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|source| Error::Stdout {
                what: "the sealed file",
                source,
            }),
        Some(path) => {
            std::fs::write(&path, text).map_err(|source| Error::WriteFile { path, source })
        }
    }
}

/// Puts the namespace into `document` before it is sealed (so the MAC binds it): its own, or `namespace`
/// where it names none; refused when it names none and none is given, or names another.
fn bind_namespace(document: &mut Value, namespace: Option<&str>) -> Result<()> {
    let own = document
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match (own, namespace) {
        (Some(own), Some(given)) if own != given => Err(Error::NamespaceMismatch {
            own,
            given: given.to_owned(),
        }),
        (Some(_), _) => Ok(()),
        (None, Some(given)) => {
            if !is_dns_label(given) {
                return Err(Error::BadNamespace {
                    given: given.to_owned(),
                });
            }
            match document.get_mut("metadata").and_then(Value::as_object_mut) {
                Some(metadata) => {
                    metadata.insert("namespace".to_owned(), Value::String(given.to_owned()));
                    Ok(())
                }
                None => Err(Error::NoMetadata),
            }
        }
        (None, None) => Err(Error::NoNamespace),
    }
}

/// Whether `text` is a DNS label (RFC 1123), as a namespace name must be.
fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The age recipients of the enrolled identity keys of `--to-cluster` clusters, as the server shows them.
fn enrolled_recipients(args: &SealArgs) -> Result<Vec<String>> {
    let Some(server) = &args.server.server else {
        return Ok(Vec::new());
    };
    let token = read_token_file(args.token.read_token_file.as_ref())?;
    let mut recipients = Vec::new();
    for named in &args.to_cluster {
        let (name, pin) = cluster_pin(named)?;
        let url = format!(
            "{}/api/v1/clusters/{}",
            server.trim_end_matches('/'),
            form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
        );
        let detail: windvane_shared::wire::fleet_api::ClusterDetail =
            crate::http::get_json(&url, token.as_deref()).map_err(|source| {
                Error::EnrolledCluster {
                    cluster: name.to_owned(),
                    server: server.clone(),
                    source: Box::new(source),
                }
            })?;
        let recipient = detail
            .cluster
            .age_recipient
            .ok_or_else(|| Error::NoAgeRecipient {
                url: url.clone(),
                cluster: name.to_owned(),
            })?;
        let keyid = &detail.cluster.keyid;
        check_enrolled(&url, name, &recipient, keyid, pin)?;
        // The server is not trusted with secrets, but here it vouches for a key: say which one, so that it can
        // be compared with what the agent logs at start ("cluster identity", age_recipient).
        eprintln!("cluster {name}: enrolled key {keyid} at {server}, age recipient {recipient}");
        recipients.push(recipient);
    }
    Ok(recipients)
}

/// `CLUSTER` or `CLUSTER=KEYID` of `--to-cluster`: the name, and the pinned key id (prefix) if any.
fn cluster_pin(named: &str) -> Result<(&str, Option<&str>)> {
    match named.split_once('=') {
        None => Ok((named, None)),
        Some((name, pin)) => {
            let hex = pin.bytes().all(|b| b.is_ascii_hexdigit());
            if name.is_empty() || !hex || !(16..=64).contains(&pin.len()) {
                return Err(Error::BadClusterPin {
                    given: named.to_owned(),
                });
            }
            Ok((name, Some(pin)))
        }
    }
}

/// Refuses a server's recipient for `name` (read from `url`) that is not the recipient of the key id it
/// shows, or whose key id is not the one pinned: a server that swapped in its own key would otherwise
/// receive the secret.
fn check_enrolled(
    url: &str,
    name: &str,
    recipient: &str,
    keyid: &str,
    pin: Option<&str>,
) -> Result<()> {
    if !sops::recipient_of_keyid(recipient, keyid) {
        return Err(Error::RecipientNotOfKey {
            url: url.to_owned(),
            cluster: name.to_owned(),
            recipient: recipient.to_owned(),
            keyid: keyid.to_owned(),
        });
    }
    if let Some(pin) = pin
        && !keyid
            .to_ascii_lowercase()
            .starts_with(&pin.to_ascii_lowercase())
    {
        return Err(Error::KeyNotPinned {
            url: url.to_owned(),
            cluster: name.to_owned(),
            keyid: keyid.to_owned(),
            pin: pin.to_owned(),
        });
    }
    Ok(())
}

/// The recipients file: names of clusters and groups to their recipients.
fn named_recipients(file: &Path, names: &[String]) -> Result<Vec<String>> {
    let shown = file.display().to_string();
    let text = read_text(file)?;
    let value = documents_to_json(&text, &shown, YamlLimits::default())
        .map_err(|source| Error::RecipientsFile {
            file: shown.clone(),
            source,
        })?
        .into_iter()
        .next()
        .map(|(_, value)| value)
        .unwrap_or(Value::Null);
    let known = recipients_by_name(&shown, &value)?;
    names
        .iter()
        .map(|name| {
            known
                .get(name)
                .cloned()
                .ok_or_else(|| Error::UnknownRecipient {
                    file: shown.clone(),
                    name: name.clone(),
                    known: known.keys().cloned().collect::<Vec<_>>().join(", "),
                })
        })
        .collect()
}

/// The `clusters:` and `groups:` of a recipients file, one map of names to recipients (each checked).
fn recipients_by_name(shown: &str, value: &Value) -> Result<BTreeMap<String, String>> {
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    for section in ["clusters", "groups"] {
        let Some(entries) = value.get(section) else {
            continue;
        };
        let Some(entries) = entries.as_object() else {
            return Err(Error::RecipientsNotMapping {
                file: shown.to_owned(),
                section,
            });
        };
        for (name, recipient) in entries {
            let Some(recipient) = recipient.as_str() else {
                return Err(Error::RecipientNotText {
                    file: shown.to_owned(),
                    section,
                    name: name.clone(),
                });
            };
            sops::parse_recipient(recipient, &format!("{shown}: {section}.{name}")).map_err(
                |source| Error::Recipient {
                    recipient: recipient.to_owned(),
                    source,
                },
            )?;
            if known.insert(name.clone(), recipient.to_owned()).is_some() {
                return Err(Error::RecipientTwice {
                    file: shown.to_owned(),
                    name: name.clone(),
                });
            }
        }
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_clusters_recipient_must_be_of_its_enrolled_and_pinned_key() {
        let key = windvane_shared::crypto::keys::signing_key_from_seed([5; 32]).verifying_key();
        let other = windvane_shared::crypto::keys::signing_key_from_seed([6; 32]).verifying_key();
        let keyid = windvane_shared::crypto::keys::keyid(&key);
        let recipient = sops::cluster_recipient(&key);
        assert!(check_enrolled("u", "eu-1", &recipient, &keyid, None).is_ok());
        assert!(check_enrolled("u", "eu-1", &recipient, &keyid, Some(&keyid[..16])).is_ok());
        // A server that shows its own recipient beside the cluster's key id.
        let swapped = sops::cluster_recipient(&other);
        let err = check_enrolled("u", "eu-1", &swapped, &keyid, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not that of the key"), "{err}");
        // Or its own key, consistently: only the pin catches it.
        let other_id = windvane_shared::crypto::keys::keyid(&other);
        assert!(check_enrolled("u", "eu-1", &swapped, &other_id, None).is_ok());
        let err = check_enrolled("u", "eu-1", &swapped, &other_id, Some(&keyid[..16]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the pinned"), "{err}");
        assert_eq!(cluster_pin("eu-1").unwrap(), ("eu-1", None));
        assert_eq!(
            cluster_pin(&format!("eu-1={}", &keyid[..20])).unwrap(),
            ("eu-1", Some(&keyid[..20]))
        );
        assert!(cluster_pin("eu-1=abc").is_err());
    }

    #[test]
    fn every_sealed_document_carries_one_namespace() {
        let mut bare = json!({"kind": "Secret", "metadata": {"name": "db"}});
        let err = bind_namespace(&mut bare.clone(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--namespace"), "{err}");
        bind_namespace(&mut bare, Some("payments")).unwrap();
        assert_eq!(bare["metadata"]["namespace"], "payments");
        let mut own = json!({"kind": "Secret", "metadata": {"name": "db", "namespace": "shop"}});
        bind_namespace(&mut own, None).unwrap();
        let err = bind_namespace(&mut own, Some("payments"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("one namespace"), "{err}");
        let mut fresh = json!({"kind": "Secret", "metadata": {"name": "db"}});
        assert!(bind_namespace(&mut fresh, Some("Bad_NS")).is_err());
        assert!(is_dns_label("a-1") && !is_dns_label("-a") && !is_dns_label(""));
    }
}
