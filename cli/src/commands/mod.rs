//! One file per verb family. Each holds its verb's arguments (the shared groups of `args.rs` flattened in)
//! and the function `main` calls; the checks themselves live in `windvane_shared`, the store's layout and
//! atomic publishing in `windvane_store`.
//!
//! | verb                                  | file          |
//! |---------------------------------------|---------------|
//! | `keygen`, `age-keygen`                | `keys.rs`     |
//! | `build` (and reading a tree or bundle)| `build.rs`    |
//! | `publish`                             | `publish.rs`  |
//! | `verify` (and reading a release)      | `verify.rs`   |
//! | `render`                              | `render.rs`   |
//! | `status`                              | `status.rs`   |
//! | `cluster rekey|forget`                | `cluster.rs`  |
//! | `rollout status|halt|resume`          | `rollout.rs`  |
//! | `rollback`                            | `rollback.rs` |
//! | `promote`                             | `promote.rs`  |
//! | `approve`                             | `approve.rs`  |
//! | `seal`                                | `seal.rs`     |
//! | `get clusters|cluster|apps|drift`     | `get.rs`      |
//! | `wait`                                | `wait.rs`     |
//! | `history`                             | `history.rs`  |
//! | `version`                             | `version.rs`  |
//! | `completion`, `man`                   | `completion.rs` |
//!
//! Verbs that print state print through `output.rs` (`-o table|json|yaml`).

pub mod approve;
pub mod build;
pub mod cluster;
pub mod completion;
pub mod get;
pub mod history;
pub mod keys;
pub mod promote;
pub mod publish;
pub mod render;
pub mod rollback;
pub mod rollout;
pub mod seal;
pub mod status;
pub mod verify;
pub mod version;
pub mod wait;
