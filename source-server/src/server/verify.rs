//! Heartbeat signature checks, batched. Checking a heartbeat's Ed25519 signature is most of what ingesting it
//! costs (a profile at 10,000 heartbeats/s: 45 % of the server's CPU in curve arithmetic). Heartbeats from a
//! fleet arrive together, so the handlers hand their signatures to [`BatchVerifier`], which takes whatever is
//! waiting (up to [`MAX_BATCH`]) and checks it in one go on a blocking thread: one multi-scalar
//! multiplication for the whole batch instead of one double-base multiplication and a point compression per
//! signature, about half the work per signature in a batch of 32 or more.
//!
//! What a batch accepts, every signature in it passes on its own as well, with the guarantees
//! `verify_strict` gives ([`windvane_shared::dsse`] relies on them): the key is strong (checked at
//! enrolment), `s` is canonical (refused by the batch itself), `R` is canonically encoded and not of small
//! order (checked here before a signature may join a batch). The one thing a batch does not rule out is a
//! signature whose `R` carries a torsion component: only the key's holder can make one (it still needs the
//! private key), so it proves nothing false about who signed. When a batch fails, each of its signatures is
//! checked alone with `verify_strict`, so one bad signature never refuses the others.

use std::sync::Arc;

use ed25519_dalek::{Signature, VerifyingKey};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Most signatures checked in one batch (beyond 64 the gain per signature is small, and latency grows).
pub const MAX_BATCH: usize = 64;

/// One signature to check.
#[derive(Debug)]
pub struct Check {
    pub message: Vec<u8>,
    pub key: VerifyingKey,
    pub signature: Signature,
}

#[derive(Debug)]
struct Job {
    check: Check,
    reply: oneshot::Sender<bool>,
}

/// Hands signature checks to a task that batches them.
#[derive(Debug, Clone)]
pub struct BatchVerifier {
    jobs: mpsc::Sender<Job>,
}

impl BatchVerifier {
    /// Starts the batching task: at most one batch per core is checked at a time.
    pub fn start() -> BatchVerifier {
        let (jobs, queue) = mpsc::channel(4 * MAX_BATCH);
        let lanes = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::spawn(run(queue, lanes));
        BatchVerifier { jobs }
    }

    /// Whether the signature verifies (with `verify_strict`'s guarantees, see the module's documentation).
    pub async fn verify(&self, check: Check) -> bool {
        let (reply, answer) = oneshot::channel();
        match self.jobs.send(Job { check, reply }).await {
            Ok(()) => answer.await.unwrap_or(false),
            // The task is gone (shutting down): check here.
            Err(mpsc::error::SendError(job)) => verify_each(&[&job.check])[0],
        }
    }
}

async fn run(mut queue: mpsc::Receiver<Job>, lanes: usize) {
    let lanes = Arc::new(Semaphore::new(lanes));
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        let Ok(lane) = Arc::clone(&lanes).acquire_owned().await else {
            return;
        };
        let batch: Vec<Job> = std::mem::replace(&mut jobs, Vec::with_capacity(MAX_BATCH));
        tokio::task::spawn_blocking(move || {
            let checks: Vec<&Check> = batch.iter().map(|j| &j.check).collect();
            let outcomes = verify_all(&checks);
            for (job, ok) in batch.into_iter().zip(outcomes) {
                let _ = job.reply.send(ok);
            }
            drop(lane);
        });
    }
}

/// Checks every signature: those fit for a batch together, falling back to one by one if the batch fails;
/// the others (and a batch of one) one by one.
pub fn verify_all(checks: &[&Check]) -> Vec<bool> {
    let (fit, unfit): (Vec<usize>, Vec<usize>) =
        (0..checks.len()).partition(|&i| fit_for_batch(&checks[i].signature));
    let mut outcomes = vec![false; checks.len()];
    if fit.len() >= 2 {
        let messages: Vec<&[u8]> = fit.iter().map(|&i| &checks[i].message[..]).collect();
        let signatures: Vec<Signature> = fit.iter().map(|&i| checks[i].signature).collect();
        let keys: Vec<VerifyingKey> = fit.iter().map(|&i| checks[i].key).collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
            for &i in &fit {
                outcomes[i] = true;
            }
        } else {
            set_each(checks, &fit, &mut outcomes);
        }
    } else {
        set_each(checks, &fit, &mut outcomes);
    }
    set_each(checks, &unfit, &mut outcomes);
    outcomes
}

fn set_each(checks: &[&Check], which: &[usize], outcomes: &mut [bool]) {
    let alone: Vec<&Check> = which.iter().map(|&i| checks[i]).collect();
    for (&i, ok) in which.iter().zip(verify_each(&alone)) {
        outcomes[i] = ok;
    }
}

fn verify_each(checks: &[&Check]) -> Vec<bool> {
    checks
        .iter()
        .map(|c| c.key.verify_strict(&c.message, &c.signature).is_ok())
        .collect()
}

/// `R` canonically encoded (its y below the field's prime; the sign bit is free) and not of small order —
/// what `verify_strict` checks about `R` and a batch would not.
fn fit_for_batch(signature: &Signature) -> bool {
    let r = signature.r_bytes();
    // y ≥ p = 2^255 − 19 exactly when the low 255 bits are 0x7fff…ffed or above.
    let y_at_least_p = r[31] & 0x7f == 0x7f && r[1..31].iter().all(|b| *b == 0xff) && r[0] >= 0xed;
    // `VerifyingKey::from_bytes` decompresses the point; `is_weak` is "of small order".
    !y_at_least_p && VerifyingKey::from_bytes(r).is_ok_and(|point| !point.is_weak())
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    fn key(n: u8) -> SigningKey {
        windvane_shared::keys::signing_key_from_seed([n; 32])
    }

    fn check(signer: &SigningKey, verifier: &SigningKey, message: &[u8]) -> Check {
        Check {
            message: message.to_vec(),
            key: verifier.verifying_key(),
            signature: signer.sign(message),
        }
    }

    #[test]
    fn a_good_batch_passes_and_one_bad_signature_refuses_only_itself() {
        let good: Vec<Check> = (1..=10)
            .map(|n| check(&key(n), &key(n), format!("heartbeat {n}").as_bytes()))
            .collect();
        let refs: Vec<&Check> = good.iter().collect();
        assert_eq!(verify_all(&refs), vec![true; 10]);

        let mut mixed: Vec<Check> = (1..=6)
            .map(|n| check(&key(n), &key(n), format!("heartbeat {n}").as_bytes()))
            .collect();
        // Signed by another key; and a signature over other bytes.
        mixed.insert(2, check(&key(9), &key(8), b"spoofed"));
        let mut tampered = check(&key(7), &key(7), b"original");
        tampered.message = b"tampered".to_vec();
        mixed.push(tampered);
        let refs: Vec<&Check> = mixed.iter().collect();
        assert_eq!(
            verify_all(&refs),
            vec![true, true, false, true, true, true, true, false]
        );
    }

    #[test]
    fn signatures_verify_strict_refuses_stay_refused() {
        let signer = key(3);
        let message = b"heartbeat";
        let good = signer.sign(message);
        // R replaced by the identity (small order) and by a non-canonical encoding of it (y = p + 1).
        let mut small_order = good.to_bytes();
        small_order[..32].copy_from_slice(&{
            let mut r = [0u8; 32];
            r[0] = 1;
            r
        });
        let mut non_canonical = good.to_bytes();
        non_canonical[..32].copy_from_slice(&{
            let mut r = [0xffu8; 32];
            r[0] = 0xee;
            r[31] = 0x7f;
            r
        });
        for bytes in [small_order, non_canonical] {
            let signature = Signature::from_bytes(&bytes);
            assert!(!fit_for_batch(&signature));
            let checks = [
                Check {
                    message: message.to_vec(),
                    key: signer.verifying_key(),
                    signature,
                },
                check(&signer, &signer, message),
            ];
            let refs: Vec<&Check> = checks.iter().collect();
            assert_eq!(verify_all(&refs), vec![false, true]);
        }
        assert!(fit_for_batch(&good));
    }

    #[tokio::test]
    async fn the_verifier_answers_concurrent_checks() {
        let verifier = BatchVerifier::start();
        let tasks: Vec<_> = (1..=40u8)
            .map(|n| {
                let verifier = verifier.clone();
                tokio::spawn(async move {
                    let signer = key(n);
                    let verifier_key = if n % 10 == 0 { key(n + 1) } else { key(n) };
                    verifier
                        .verify(check(&signer, &verifier_key, &[n; 100]))
                        .await
                })
            })
            .collect();
        for (n, task) in (1..=40u8).zip(tasks) {
            assert_eq!(task.await.expect("task"), n % 10 != 0, "check {n}");
        }
    }
}
