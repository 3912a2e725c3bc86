//! Devices a DRA driver publishes in ResourceSlices (`resource.k8s.io/v1`), and the card
//! model of each, read from the device's own attributes.

use std::collections::BTreeMap;

use serde_json::Value;

use super::settings::{DraSettings, DriverModel};
use super::DraError;
use crate::cards::names::CardName;
use crate::cards::nodes::mig_model;

/// A device attribute's value (exactly one of the API's `string`, `int`, `bool`,
/// `version` fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    String(String),
    Int(i64),
    Bool(bool),
    Version(String),
}

impl Attribute {
    fn parse(v: &Value) -> Option<Self> {
        if let Some(s) = v.get("string").and_then(Value::as_str) {
            return Some(Self::String(s.to_string()));
        }
        if let Some(i) = v.get("int").and_then(Value::as_i64) {
            return Some(Self::Int(i));
        }
        if let Some(b) = v.get("bool").and_then(Value::as_bool) {
            return Some(Self::Bool(b));
        }
        v.get("version")
            .and_then(Value::as_str)
            .map(|s| Self::Version(s.to_string()))
    }

    /// The value as text (a string or a version), for model names.
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::String(s) | Self::Version(s) => Some(s),
            _ => None,
        }
    }
}

/// Where a device is published: its driver, pool and name (what a claim's allocation
/// result names).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub name: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.name)
    }
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub id: DeviceId,
    /// The node whose slice published it (`spec.nodeName`); `None` for devices reachable
    /// from several nodes.
    pub node: Option<String>,
    /// Attributes by domain and name: a name without a domain is in the driver's.
    pub attributes: BTreeMap<String, BTreeMap<String, Attribute>>,
    /// Capacities by domain and name, as the API writes the quantity.
    pub capacity: BTreeMap<String, BTreeMap<String, String>>,
    /// The card model, for a driver that publishes cards: `None` for other drivers,
    /// an error when a card driver's device lacks what names its model.
    pub model: Option<Result<CardName, DraError>>,
}

impl Device {
    /// An attribute in the driver's own domain.
    pub fn own(&self, name: &str) -> Option<&Attribute> {
        self.attributes.get(&self.id.driver)?.get(name)
    }
}

/// The devices of one ResourceSlice, each with its card model when `settings` says its
/// driver publishes cards.
pub fn slice_devices(slice: &Value, settings: &DraSettings) -> Result<Vec<Device>, DraError> {
    let name = slice
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let bad = |field: &str, expected: &str| DraError::Slice {
        slice: name.clone(),
        field: field.to_string(),
        expected: expected.to_string(),
    };
    let spec = slice.get("spec").ok_or_else(|| bad("spec", "an object"))?;
    let driver = spec
        .get("driver")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("spec.driver", "a driver name"))?;
    let pool = spec
        .pointer("/pool/name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("spec.pool.name", "a pool name"))?;
    let node = spec
        .get("nodeName")
        .and_then(Value::as_str)
        .map(str::to_string);
    let rule = settings.driver(driver);
    let mut out = Vec::new();
    let devices = match spec.get("devices") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Array(d)) => d,
        Some(_) => return Err(bad("spec.devices", "a list")),
    };
    for (i, d) in devices.iter().enumerate() {
        let device = d
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("spec.devices[{i}].name"), "a device name"))?;
        let mut attributes: BTreeMap<String, BTreeMap<String, Attribute>> = BTreeMap::new();
        if let Some(Value::Object(attrs)) = d.get("attributes") {
            for (k, v) in attrs {
                let Some(a) = Attribute::parse(v) else {
                    return Err(bad(
                        &format!("spec.devices[{i}].attributes.{k}"),
                        "one of string, int, bool, version",
                    ));
                };
                let (domain, attr) = qualified(k, driver);
                attributes.entry(domain).or_default().insert(attr, a);
            }
        }
        let mut capacity: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        if let Some(Value::Object(caps)) = d.get("capacity") {
            for (k, v) in caps {
                let value = match v.get("value") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => continue,
                };
                let (domain, cap) = qualified(k, driver);
                capacity.entry(domain).or_default().insert(cap, value);
            }
        }
        let mut dev = Device {
            id: DeviceId {
                driver: driver.to_string(),
                pool: pool.to_string(),
                name: device.to_string(),
            },
            node: node.clone(),
            attributes,
            capacity,
            model: None,
        };
        dev.model = rule.map(|r| device_model(r, &dev));
        out.push(dev);
    }
    Ok(out)
}

/// `domain/name` as written, or a bare name in the driver's domain.
fn qualified(key: &str, driver: &str) -> (String, String) {
    match key.rsplit_once('/') {
        Some((domain, name)) => (domain.to_string(), name.to_string()),
        None => (driver.to_string(), key.to_string()),
    }
}

/// The model a card driver's device is: its product attribute in the names node labels
/// give (`NVIDIA H200` -> `NVIDIA-H200`, as GPU Feature Discovery writes it), and for a
/// partition the product's MIG model (`NVIDIA-H200/mig-1g.18gb-mixed`).
pub fn device_model(rule: &DriverModel, device: &Device) -> Result<CardName, DraError> {
    let missing = |attribute: &str| DraError::DeviceModel {
        device: device.id.to_string(),
        attribute: attribute.to_string(),
    };
    let product = device
        .own(&rule.product)
        .and_then(Attribute::text)
        .map(normalise_product)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| missing(&rule.product))?;
    let partition = rule.partition.as_ref().is_some_and(|(attr, value)| {
        device.own(attr).and_then(Attribute::text) == Some(value.as_str())
    });
    let name = match (partition, &rule.profile) {
        (true, Some(p)) => {
            let profile = device
                .own(p)
                .and_then(Attribute::text)
                .ok_or_else(|| missing(p))?;
            mig_model(&product, profile)
        }
        _ => product,
    };
    CardName::parse(&name).map_err(|e| DraError::ModelName {
        device: device.id.to_string(),
        reason: e.to_string(),
    })
}

/// A product name as GPU Feature Discovery labels it: words joined by `-`.
pub fn normalise_product(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(devices: Value) -> Value {
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-1-gpu"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-1",
                     "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}})
    }

    #[test]
    fn a_gpu_and_a_mig_partition_get_the_models_node_labels_give() {
        let s = slice(serde_json::json!([
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"},
                "driverVersion": {"version": "580.65.6"}, "index": {"int": 0}},
             "capacity": {"memory": {"value": "141Gi"}}},
            {"name": "gpu-1-mig-1g18gb-0", "attributes": {"type": {"string": "mig"}, "productName": {"string": "NVIDIA H200"},
                "profile": {"string": "1g.18gb"}}},
            {"name": "gpu-2", "attributes": {"type": {"string": "gpu"}}}
        ]));
        let d = slice_devices(&s, &DraSettings::default()).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(
            d[0].model,
            Some(Ok(CardName::parse("NVIDIA-H200").unwrap()))
        );
        assert_eq!(d[0].node.as_deref(), Some("node-1"));
        assert_eq!(d[0].own("index"), Some(&Attribute::Int(0)));
        assert_eq!(d[0].capacity["gpu.nvidia.com"]["memory"], "141Gi");
        assert_eq!(
            d[1].model,
            Some(Ok(CardName::parse("NVIDIA-H200/mig-1g.18gb-mixed").unwrap()))
        );
        assert_eq!(
            d[2].model.as_ref().unwrap().as_ref().unwrap_err().to_string(),
            "device gpu.nvidia.com/node-1/gpu-2 has no attribute productName to name its card model"
        );
    }

    #[test]
    fn a_driver_that_publishes_no_cards_has_devices_without_a_model() {
        let mut s = slice(
            serde_json::json!([{"name": "nic-0", "attributes": {"productName": {"string": "ConnectX-7"}}}]),
        );
        s["spec"]["driver"] = "sriov.example.com".into();
        let d = slice_devices(&s, &DraSettings::default()).unwrap();
        assert_eq!(d[0].model, None);
    }

    #[test]
    fn a_malformed_slice_names_the_field() {
        let mut s = slice(serde_json::json!([{"attributes": {}}]));
        assert_eq!(
            slice_devices(&s, &DraSettings::default())
                .unwrap_err()
                .to_string(),
            "ResourceSlice node-1-gpu: spec.devices[0].name: expected a device name"
        );
        s["spec"]["devices"] =
            serde_json::json!([{"name": "gpu-0", "attributes": {"x": {"float": 1.5}}}]);
        assert_eq!(
            slice_devices(&s, &DraSettings::default()).unwrap_err().to_string(),
            "ResourceSlice node-1-gpu: spec.devices[0].attributes.x: expected one of string, int, bool, version"
        );
    }
}
