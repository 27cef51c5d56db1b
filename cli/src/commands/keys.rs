//! `windvane keygen` and `windvane age-keygen`: new keys from the operating system's random source. `keygen`
//! writes a release key pair (PREFIX.key and PREFIX.pub); `age-keygen` an age identity file (for a cluster's
//! or a group's key Secret) and prints its recipient, which `seal` and the recipients file name. A private
//! key is written with mode 0600 and never over an existing file.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use windvane_shared::crypto::keys;
use windvane_shared::format::sops::Keyring;

use crate::error::{Error, Result};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Path prefix: writes PREFIX.key and PREFIX.pub. Existing files are never overwritten.
    #[arg(long, value_name = "PREFIX", env = "WINDVANE_KEY_PREFIX")]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct AgeKeygenArgs {
    /// The identity file to write (mode 0600, never over an existing file), as `age-keygen` writes it.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

pub fn keygen(args: KeygenArgs) -> Result<()> {
    let key_path = with_suffix(&args.out, ".key");
    let pub_path = with_suffix(&args.out, ".pub");
    for path in [&key_path, &pub_path] {
        if path.exists() {
            return Err(Error::KeyExists { path: path.clone() });
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|source| Error::Random { source })?;
    let signing_key = keys::signing_key_from_seed(seed);
    seed.fill(0);
    let verifying_key = signing_key.verifying_key();

    write_new(
        &key_path,
        keys::signing_key_to_pem(&signing_key).as_bytes(),
        0o600,
    )?;
    if let Err(e) = write_new(
        &pub_path,
        keys::verifying_key_to_pem(&verifying_key).as_bytes(),
        0o644,
    ) {
        let _ = std::fs::remove_file(&key_path);
        return Err(e);
    }
    println!(
        "private key: {} (keep it secret; mode 0600)",
        key_path.display()
    );
    println!(
        "public key:  {} (give it to cluster operators as --trusted-key)",
        pub_path.display()
    );
    println!("key id:      {}", keys::keyid(&verifying_key));
    Ok(())
}

/// Writes a new age identity and prints its recipient (what `seal` and the recipients file name).
pub fn age_keygen(args: AgeKeygenArgs) -> Result<()> {
    let (secret, recipient) = Keyring::generate();
    let created = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
    let text = format!("# created: {created}\n# public key: {recipient}\n{secret}\n");
    write_new(&args.output, text.as_bytes(), 0o600)?;
    println!("{recipient}");
    Ok(())
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates `path` with `mode` (never over an existing file), writes `bytes` and syncs them to disk.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| Error::CreateKeyFile {
            path: path.to_path_buf(),
            source,
        })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::WriteFile {
            path: path.to_path_buf(),
            source,
        })
}
