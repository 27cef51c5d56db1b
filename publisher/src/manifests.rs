//! The manifests of one file of a fleet tree or of an engine's output: YAML (or JSON) documents read as kubectl
//! reads them, `*List` documents expanded into their items, each checked to be a Kubernetes object. Called by
//! the fleet-tree reader ([`crate::source`]) for plain files and by the engines ([`crate::prerender`]) for what
//! `helm template` and `kustomize build` print.

use serde_json::Value;
use windvane_shared::format::bundle::{Manifest, check_manifest_object};
use windvane_shared::text::yaml::{self, Yaml11, YamlLimits, YamlWarning};
use windvane_shared::{Error, Result};

/// The kind of a document kubectl would expand into its items: `kind: List` and every `*List`
/// (`ConfigMapList`, `RoleBindingList`, ...), as the API returns them from a list call.
fn list_kind(object: &Value) -> Option<&str> {
    let kind = object.get("kind").and_then(Value::as_str)?;
    kind.ends_with("List").then_some(kind)
}

/// The manifests of one file: every non-empty document, `kind: List` documents expanded into their items,
/// each checked to be a Kubernetes object. YAML is read as kubectl reads it; where a YAML 1.2 reader would
/// read otherwise, a warning is added to `warnings`.
pub fn manifests_of(
    file: &str,
    text: &str,
    warnings: &mut Vec<YamlWarning>,
) -> Result<Vec<Manifest>> {
    let documents = if file.ends_with(".json") {
        vec![(0, yaml::json_to_value(text, file)?)]
    } else {
        let read = yaml::read_documents(text, file, YamlLimits::default(), Yaml11::Read)?;
        warnings.extend(read.warnings);
        read.documents
    };
    let mut manifests = Vec::new();
    for (document, object) in documents {
        // A SOPS document travels encrypted; its identity must be readable without the key.
        if windvane_shared::format::sops::is_encrypted(&object) {
            windvane_shared::format::sops::check_identity_in_clear(file, document, &object)?;
            if let Some(kind) = list_kind(&object) {
                return Err(Error::Manifest {
                    file: file.to_owned(),
                    document,
                    detail: format!(
                        "a SOPS-encrypted {kind} is not supported (its items would lose the file's \
                         metadata); encrypt each object as a document of its own"
                    ),
                });
            }
        }
        if let Some(kind) = list_kind(&object) {
            let Some(items) = object.get("items").and_then(Value::as_array) else {
                return Err(Error::Manifest {
                    file: file.to_owned(),
                    document,
                    detail: format!("a {kind} must have items (a list of objects)"),
                });
            };
            for (index, item) in items.iter().enumerate() {
                check_manifest_object(file, document, item).map_err(|error| match error {
                    Error::Manifest {
                        file,
                        document,
                        detail,
                    } => Error::Manifest {
                        file,
                        document,
                        detail: format!("{kind} item {index}: {detail}"),
                    },
                    other => other,
                })?;
                manifests.push(Manifest {
                    file: file.to_owned(),
                    document,
                    object: item.clone(),
                });
            }
        } else {
            check_manifest_object(file, document, &object)?;
            manifests.push(Manifest {
                file: file.to_owned(),
                document,
                object,
            });
        }
    }
    Ok(manifests)
}
