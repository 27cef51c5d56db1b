//! Heartbeat signature checks, batched. Checking a heartbeat's Ed25519 signature is most of what ingesting it
//! costs (a profile at 10,000 heartbeats/s: 45 % of the server's CPU in curve arithmetic). Heartbeats from a
//! fleet arrive together, so the handlers hand their signatures to [`BatchVerifier`], which takes whatever is
//! waiting (up to [`MAX_BATCH`]) and checks it in one go on a blocking thread: one multi-scalar
//! multiplication for the whole batch instead of one double-base multiplication and a point compression per
//! signature, about half the work per signature in a batch of 32 or more.
//!
//! What a batch accepts, every signature in it passes on its own as well, with the guarantees
//! `verify_strict` gives ([`windvane_shared::crypto::dsse`] relies on them): the key is strong (checked at
//! enrolment), `s` is canonical (refused by the batch itself), `R` is canonically encoded and not of small
//! order (checked here before a signature may join a batch). The one thing a batch does not rule out is a
//! signature whose `R` carries a torsion component: only the key's holder can make one (it still needs the
//! private key), so it proves nothing false about who signed. When a batch fails, each of its signatures is
//! checked alone with `verify_strict`, so one bad signature never refuses the others.

use std::sync::Arc;

use ed25519_dalek::{Signature, VerifyingKey};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::fleet::metrics::Metrics;

/// Most signatures checked in one batch (beyond 64 the gain per signature is small, and latency grows).
pub const MAX_BATCH: usize = 64;
/// A batch smaller than this waits up to [`GATHER`] for more signatures (from 16 on, a batch costs about
/// half of `verify_strict` per signature; beyond, little changes).
const GATHER_UNTIL: usize = 16;
const GATHER: std::time::Duration = std::time::Duration::from_millis(1);

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
    /// Starts the batching task: at most one batch per core is checked at a time. Batch sizes go to
    /// `metrics` when given.
    pub fn start(metrics: Option<Arc<Metrics>>) -> BatchVerifier {
        let (jobs, queue) = mpsc::channel(4 * MAX_BATCH);
        let lanes = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::spawn(run(queue, lanes, metrics));
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

async fn run(mut queue: mpsc::Receiver<Job>, lanes: usize, metrics: Option<Arc<Metrics>>) {
    let lanes = Arc::new(Semaphore::new(lanes));
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        // Heartbeats stream in one by one even at 10,000/s: taking only what is waiting makes batches of one
        // or two, which cost a full `verify_strict` each. A short wait for company (at most GATHER, and only
        // while a batch is small) makes them 2-3 times cheaper per signature under load and costs an idle
        // server a millisecond per heartbeat.
        let deadline = tokio::time::Instant::now() + GATHER;
        while jobs.len() < GATHER_UNTIL {
            let room = MAX_BATCH - jobs.len();
            match tokio::time::timeout_at(deadline, queue.recv_many(&mut jobs, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let Ok(lane) = Arc::clone(&lanes).acquire_owned().await else {
            return;
        };
        let batch: Vec<Job> = std::mem::replace(&mut jobs, Vec::with_capacity(MAX_BATCH));
        if let Some(metrics) = &metrics {
            metrics.signature_batch_size.observe(batch.len() as f64);
        }
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
/// what `verify_strict` checks about `R` and a batch would not. Read from the encoding alone: the batch
/// decompresses `R` anyway, and doing it here as well cost 5 µs per heartbeat.
fn fit_for_batch(signature: &Signature) -> bool {
    let mut y = *signature.r_bytes();
    y[31] &= 0x7f;
    // y ≥ p = 2^255 − 19 exactly when the low 255 bits are 0x7fff…ffed or above.
    let y_at_least_p = y[31] == 0x7f && y[1..31].iter().all(|b| *b == 0xff) && y[0] >= 0xed;
    !y_at_least_p && !SMALL_ORDER_Y.contains(&y)
}

/// The y coordinates (little-endian, sign bit clear) of the eight points of small order: the identity (1),
/// the point of order 2 (p − 1), the two of order 4 (0), and the four of order 8 (±c). No other canonical
/// encoding decodes to a point of small order.
const SMALL_ORDER_Y: [[u8; 32]; 5] = [
    [0; 32],
    {
        let mut one = [0; 32];
        one[0] = 1;
        one
    },
    {
        let mut p_minus_1 = [0xff; 32];
        p_minus_1[0] = 0xec;
        p_minus_1[31] = 0x7f;
        p_minus_1
    },
    [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ],
    [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ],
];

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    fn key(n: u8) -> SigningKey {
        windvane_shared::crypto::keys::signing_key_from_seed([n; 32])
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

    #[test]
    fn the_small_order_list_is_exactly_the_eight_points_of_small_order() {
        // Every listed y, with either sign, either fails to decode or decodes to a point of small order, and
        // together they give the eight distinct points there are, so nothing of small order is missing.
        let mut points = std::collections::BTreeSet::new();
        for y in SMALL_ORDER_Y {
            for sign in [0, 0x80] {
                let mut encoding = y;
                encoding[31] |= sign;
                if let Ok(point) = VerifyingKey::from_bytes(&encoding) {
                    assert!(point.is_weak(), "{encoding:02x?} is not of small order");
                    points.insert(point.to_edwards().compress().to_bytes());
                }
            }
        }
        assert_eq!(points.len(), 8);
        // And the R of real signatures is never taken for one.
        for n in 0..=255u8 {
            let signature = key(n).sign(&[n; 40]);
            assert!(fit_for_batch(&signature), "signature {n}");
        }
    }

    #[tokio::test]
    async fn the_verifier_answers_concurrent_checks() {
        let verifier = BatchVerifier::start(None);
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
