//! Prevention: the objects of the release with `prevent` on are guarded by a ValidatingAdmissionPolicy that
//! refuses changes to the fields Windvane owns. [`policy`] decides it purely (the policy and binding, whether
//! they were tampered with, break-glass approvals) from the objects a sync applied; [`keeper::Prevention`]
//! owns what the agent knows of the policy in the cluster and is the only part that writes it (apply, restore
//! after tampering, delete when nothing is guarded). The engine hands it each sync's results and the policy's
//! watch events; it answers with whether prevention is in force.

pub mod keeper;
pub mod policy;
