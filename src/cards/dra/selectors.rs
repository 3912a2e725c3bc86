//! A DeviceClass's or a request's CEL selector, evaluated against one published device
//! as Kubernetes does (`device.driver`, `device.attributes[domain].name`,
//! `device.capacity[domain].name`), with the `cel` crate.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::{Context, Env, Program, Value};

use super::devices::{Attribute, Device};
use super::DraError;

/// The CEL environment selectors compile and run in: the standard library with optional
/// values (`a.?b`, `a[?b]`, `optional.of`), which Kubernetes' CEL has had since 1.28.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// A compiled selector.
#[derive(Clone)]
pub struct Selector {
    expression: String,
    program: Arc<Program>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Selector").field(&self.expression).finish()
    }
}

impl PartialEq for Selector {
    fn eq(&self, other: &Self) -> bool {
        self.expression == other.expression
    }
}

impl Eq for Selector {}

/// What a selector says of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    Yes,
    No,
    /// It could not be decided here: Kubernetes' quantity and semver functions are not
    /// in this evaluator, and a missing attribute is an error. Counted as a match, so a
    /// claim's possible models are never fewer than the scheduler's.
    Undecided(String),
}

impl Selector {
    /// Compiles `expression`; `source` names where it was written, for the error.
    pub fn compile(expression: &str, source: &str) -> Result<Self, DraError> {
        let program = ENV.compile(expression).map_err(|e| DraError::Selector {
            origin: source.to_string(),
            expression: expression.to_string(),
            reason: e.to_string(),
        })?;
        let cost = super::cost::estimate(program.expression()).cost;
        if cost > super::cost::MAX_COST_PER_DEVICE {
            return Err(DraError::SelectorCost {
                origin: source.to_string(),
                expression: expression.to_string(),
                cost,
                limit: super::cost::MAX_COST_PER_DEVICE,
            });
        }
        Ok(Self {
            expression: expression.to_string(),
            program: Arc::new(program),
        })
    }

    /// The CEL expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Evaluates the selector for `device`.
    pub fn matches(&self, device: &Device) -> Match {
        let mut ctx = Context::with_env(ENV.clone());
        ctx.add_variable_from_value("device", device_value(device));
        match self.program.execute(&ctx) {
            Ok(Value::Bool(true)) => Match::Yes,
            Ok(Value::Bool(false)) => Match::No,
            Ok(other) => Match::Undecided(format!("not a boolean: {other:?}")),
            Err(e) => Match::Undecided(e.to_string()),
        }
    }
}

fn device_value(device: &Device) -> Value {
    let attributes: HashMap<String, Value> = device
        .attributes
        .iter()
        .map(|(domain, attrs)| {
            let inner: HashMap<String, Value> = attrs
                .iter()
                .map(|(k, a)| {
                    let v = match a {
                        Attribute::String(s) | Attribute::Version(s) => {
                            Value::String(Arc::new(s.clone()))
                        }
                        Attribute::Int(i) => Value::Int(*i),
                        Attribute::Bool(b) => Value::Bool(*b),
                    };
                    (k.clone(), v)
                })
                .collect();
            (domain.clone(), Value::from(inner))
        })
        .collect();
    let capacity: HashMap<String, Value> = device
        .capacity
        .iter()
        .map(|(domain, caps)| {
            let inner: HashMap<String, Value> = caps
                .iter()
                .map(|(k, q)| (k.clone(), Value::String(Arc::new(q.clone()))))
                .collect();
            (domain.clone(), Value::from(inner))
        })
        .collect();
    let mut d: HashMap<String, Value> = HashMap::new();
    d.insert(
        "driver".into(),
        Value::String(Arc::new(device.id.driver.clone())),
    );
    d.insert("attributes".into(), Value::from(attributes));
    d.insert("capacity".into(), Value::from(capacity));
    Value::from(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::dra::devices::slice_devices;
    use crate::cards::dra::DraSettings;

    fn h200() -> Device {
        let s = serde_json::json!({"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com",
            "pool": {"name": "node-1"}, "devices": [{"name": "gpu-0", "attributes": {
                "type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"},
                "driverVersion": {"version": "580.65.6"}}, "capacity": {"memory": {"value": "141Gi"}}}]}});
        slice_devices(&s, &DraSettings::default())
            .unwrap()
            .remove(0)
    }

    /// Issue 57 #7: Kubernetes' CEL optional syntax compiles and is evaluated.
    #[test]
    fn selectors_may_use_cel_optionals() {
        let d = h200();
        let m = |e: &str| Selector::compile(e, "test").unwrap().matches(&d);
        assert_eq!(
            m("device.attributes['gpu.nvidia.com'].?productName.orValue('') == 'NVIDIA H200'"),
            Match::Yes
        );
        assert_eq!(
            m("device.attributes['gpu.nvidia.com'].?nothing.orValue('x') == 'x'"),
            Match::Yes
        );
        assert_eq!(
            m("device.attributes[?'gpu.nvidia.com'].hasValue()"),
            Match::Yes
        );
        assert_eq!(m("device.attributes[?'amd.com'].hasValue()"), Match::No);
    }

    #[test]
    fn selectors_read_the_driver_attributes_and_capacity_as_kubernetes_writes_them() {
        let d = h200();
        let m = |e: &str| Selector::compile(e, "test").unwrap().matches(&d);
        assert_eq!(m("device.driver == 'gpu.nvidia.com'"), Match::Yes);
        assert_eq!(
            m("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"),
            Match::Yes
        );
        assert_eq!(
            m("device.attributes['gpu.nvidia.com'].type == 'mig'"),
            Match::No
        );
        assert_eq!(
            m("'gpu.nvidia.com' in device.attributes && device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H1')"),
            Match::No
        );
        assert!(matches!(
            m("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0"),
            Match::Undecided(_)
        ));
        assert!(matches!(
            m("device.attributes['other.com'].x == 1"),
            Match::Undecided(_)
        ));
        assert!(matches!(m("1 + 1"), Match::Undecided(_)));
        let e = Selector::compile("device.driver ==", "DeviceClass gpu.nvidia.com").unwrap_err();
        assert!(
            e.to_string().starts_with(
                "DeviceClass gpu.nvidia.com: selector \"device.driver ==\" does not compile: "
            ),
            "{e}"
        );
    }
}
