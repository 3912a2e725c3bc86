//! What a record built from a pod spec describes, so that messages name it rightly: a
//! pod, or the pod template of a workload (a scale-up is decided over its template).

use std::fmt;

use super::ObjectKey;

/// Which kind of workload a replica count belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Deployment,
    ReplicaSet,
    StatefulSet,
}

impl WorkloadKind {
    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "Deployment" => Some(Self::Deployment),
            "ReplicaSet" => Some(Self::ReplicaSet),
            "StatefulSet" => Some(Self::StatefulSet),
            _ => None,
        }
    }
    pub fn from_resource(resource: &str) -> Option<Self> {
        match resource {
            "deployments" => Some(Self::Deployment),
            "replicasets" => Some(Self::ReplicaSet),
            "statefulsets" => Some(Self::StatefulSet),
            _ => None,
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::ReplicaSet => "ReplicaSet",
            Self::StatefulSet => "StatefulSet",
        }
    }
    pub fn lower(&self) -> &'static str {
        match self {
            Self::Deployment => "deployment",
            Self::ReplicaSet => "replicaset",
            Self::StatefulSet => "statefulset",
        }
    }
}

/// What a pod record describes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Subject {
    #[default]
    Pod,
    /// The pod template of a workload (the record's key is the workload's).
    Template(WorkloadKind),
    /// The pod template of one task of a Volcano Job (`batch.volcano.sh`).
    JobTask,
}

impl Subject {
    /// The subject with its key, as messages name it.
    pub fn named(self, key: &ObjectKey) -> Named<'_> {
        Named { subject: self, key }
    }
}

/// `pod ml/a`, or `the pod template of deployment ml/train`.
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    subject: Subject,
    key: &'a ObjectKey,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.subject {
            Subject::Pod => write!(f, "pod {}", self.key),
            Subject::Template(k) => write!(f, "the pod template of {} {}", k.lower(), self.key),
            Subject::JobTask => write!(f, "the pod template of job {}", self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_named_after_its_workload() {
        let key = ObjectKey::new("ml", "train");
        assert_eq!(Subject::Pod.named(&key).to_string(), "pod ml/train");
        assert_eq!(
            Subject::Template(WorkloadKind::StatefulSet)
                .named(&key)
                .to_string(),
            "the pod template of statefulset ml/train"
        );
    }
}
