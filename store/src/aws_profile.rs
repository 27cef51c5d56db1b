//! The AWS shared configuration files, the one link of the usual credential chain that `object_store`'s S3
//! client does not read itself: a profile (`AWS_PROFILE`, else `default`) of `~/.aws/credentials`
//! (`AWS_SHARED_CREDENTIALS_FILE`) and `~/.aws/config` (`AWS_CONFIG_FILE`) gives static keys and a region.
//! The environment's own keys and region come first, as in the AWS SDKs; web identity, container and
//! instance credentials come after, from the client. Parsing is pure ([`profile_settings`]); [`from_files`]
//! only reads the files, capped.

use std::path::PathBuf;

use crate::{Error, Result};

/// Larger shared configuration files than this are refused rather than read.
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// What a profile gives the S3 client, as `object_store` configuration keys.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ProfileSettings {
    pub settings: Vec<(String, String)>,
}

/// The named profile's keys and region from the two files' texts (`None`: no such file). An error when the
/// profile exists but cannot be used here (role assumption or SSO).
pub(crate) fn profile_settings(
    profile: &str,
    credentials: Option<&str>,
    config: Option<&str>,
) -> Result<Option<ProfileSettings>> {
    let config_section = if profile == "default" {
        "default".to_owned()
    } else {
        format!("profile {profile}")
    };
    let from_credentials = credentials.and_then(|text| section(text, profile));
    let from_config = config.and_then(|text| section(text, &config_section));
    if from_credentials.is_none() && from_config.is_none() {
        return Ok(None);
    }
    let lookup = |key: &str| {
        from_credentials
            .as_ref()
            .and_then(|pairs| value(pairs, key))
            .or_else(|| from_config.as_ref().and_then(|pairs| value(pairs, key)))
    };
    let mut settings = Vec::new();
    match (lookup("aws_access_key_id"), lookup("aws_secret_access_key")) {
        (Some(id), Some(secret)) => {
            settings.push(("aws_access_key_id".to_owned(), id));
            settings.push(("aws_secret_access_key".to_owned(), secret));
            if let Some(token) = lookup("aws_session_token") {
                settings.push(("aws_session_token".to_owned(), token));
            }
        }
        _ if [
            "role_arn",
            "sso_session",
            "sso_start_url",
            "credential_process",
        ]
        .iter()
        .any(|key| lookup(key).is_some()) =>
        {
            return Err(Error::AwsProfileUnsupported {
                profile: profile.to_owned(),
            });
        }
        _ => {}
    }
    if let Some(region) = lookup("region") {
        settings.push(("aws_region".to_owned(), region));
    }
    Ok(Some(ProfileSettings { settings }))
}

/// The `key = value` pairs of `[name]` in an INI text.
fn section(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut inside = false;
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
            if inside {
                found.get_or_insert_with(Vec::new);
            }
            continue;
        }
        if let (true, Some((key, value))) = (inside, line.split_once('=')) {
            let pairs = found.get_or_insert_with(Vec::new);
            pairs.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    found
}

fn value(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .filter(|v| !v.is_empty())
}

/// The settings of the environment's profile, minus what the environment (or `explicit`) sets itself.
/// Missing files are no error, unless `AWS_PROFILE` names a profile that is in neither.
pub(crate) fn from_files(explicit: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let home = env("HOME").map(PathBuf::from);
    let file = |variable: &str, default: &str| {
        env(variable)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
    };
    let credentials_path = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let config_path = file("AWS_CONFIG_FILE", "config");
    let read = |path: &Option<PathBuf>| -> Result<Option<String>> {
        let Some(path) = path.as_ref().filter(|p| p.is_file()) else {
            return Ok(None);
        };
        let bytes = crate::read_capped_file(path, MAX_FILE_BYTES, "AWS configuration file")?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    };
    let named = env("AWS_PROFILE");
    let profile = named.clone().unwrap_or_else(|| "default".to_owned());
    let (credentials, config) = (read(&credentials_path)?, read(&config_path)?);
    let refused = |detail: String| Error::AwsProfile {
        profile: profile.clone(),
        detail,
    };
    let Some(found) = profile_settings(&profile, credentials.as_deref(), config.as_deref())? else {
        return match named {
            Some(_) => Err(refused(format!(
                "not found in {} or {}",
                shown(&credentials_path),
                shown(&config_path)
            ))),
            None => Ok(Vec::new()),
        };
    };
    let set_elsewhere = |key: &str| {
        explicit.iter().any(|(k, _)| k == key)
            || match key {
                "aws_region" => env("AWS_REGION").or(env("AWS_DEFAULT_REGION")).is_some(),
                "aws_access_key_id" | "aws_secret_access_key" | "aws_session_token" => {
                    env("AWS_ACCESS_KEY_ID").is_some()
                        || explicit.iter().any(|(k, _)| k == "aws_access_key_id")
                }
                _ => false,
            }
    };
    Ok(found
        .settings
        .into_iter()
        .filter(|(key, _)| !set_elsewhere(key))
        .collect())
}

fn shown(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map_or("(no HOME)".to_owned(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "\
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret-default

# the release pipeline's keys
[release]
aws_access_key_id=AKIDRELEASE
aws_secret_access_key=secret-release
aws_session_token = token-release
";
    const CONFIG: &str = "\
[default]
region = us-east-1

[profile release]
region = eu-west-1

[profile admin]
role_arn = arn:aws:iam::123456789012:role/admin
source_profile = default
region = eu-central-1
";

    fn pairs(found: Option<ProfileSettings>) -> Vec<(String, String)> {
        found.expect("the profile").settings
    }

    #[test]
    fn a_named_profile_takes_its_keys_from_credentials_and_its_region_from_config() {
        let found = profile_settings("release", Some(CREDENTIALS), Some(CONFIG)).unwrap();
        let expected: Vec<(String, String)> = [
            ("aws_access_key_id", "AKIDRELEASE"),
            ("aws_secret_access_key", "secret-release"),
            ("aws_session_token", "token-release"),
            ("aws_region", "eu-west-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(pairs(found), expected);
    }

    #[test]
    fn the_default_profile_is_a_plain_section_in_both_files() {
        let found = pairs(profile_settings("default", Some(CREDENTIALS), Some(CONFIG)).unwrap());
        assert_eq!(found[0].1, "AKIDDEFAULT");
        assert_eq!(found.last().map(|(_, v)| v.as_str()), Some("us-east-1"));
        assert_eq!(found.len(), 3, "no session token: {found:?}");
    }

    #[test]
    fn a_role_profile_is_refused_with_what_to_do_and_a_missing_one_is_none() {
        let refused = profile_settings("admin", Some(CREDENTIALS), Some(CONFIG))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("export-credentials"), "{refused}");
        assert_eq!(
            profile_settings("nope", Some(CREDENTIALS), Some(CONFIG)).unwrap(),
            None
        );
        assert_eq!(profile_settings("default", None, None).unwrap(), None);
    }

    #[test]
    fn keys_may_sit_in_the_config_file_alone() {
        let config = "[profile ci]\naws_access_key_id = AKIDCI\naws_secret_access_key = s\n";
        let found = pairs(profile_settings("ci", None, Some(config)).unwrap());
        assert_eq!(found[0], ("aws_access_key_id".into(), "AKIDCI".into()));
    }
}
