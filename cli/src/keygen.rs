//! `windvane keygen`: a new release key pair from the operating system's random source. The private key is
//! written with mode 0600 and never over an existing file.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use windvane_shared::crypto::keys;

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Path prefix: writes PREFIX.key and PREFIX.pub. Existing files are never overwritten.
    #[arg(long, value_name = "PREFIX", env = "WINDVANE_KEY_PREFIX")]
    out: PathBuf,
}

pub fn run(args: KeygenArgs) -> anyhow::Result<()> {
    let key_path = with_suffix(&args.out, ".key");
    let pub_path = with_suffix(&args.out, ".pub");
    for path in [&key_path, &pub_path] {
        if path.exists() {
            bail!(
                "{} already exists; keygen never overwrites a key (choose another --out)",
                path.display()
            );
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("reading the OS random source: {e}"))?;
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

fn with_suffix(prefix: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn write_new(path: &PathBuf, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}
