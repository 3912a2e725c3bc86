//! Which DRA drivers publish cards, how each names a device's model, and which
//! DeviceClasses are card classes: one setting for discovery, demand and the install's
//! hook conditions alike.

use std::collections::BTreeSet;

use super::DraError;

/// How one driver names the card model of a device it publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverModel {
    /// The driver (`spec.driver` of its ResourceSlices).
    pub driver: String,
    /// Its attribute holding the product name (`NVIDIA H200`).
    pub product: String,
    /// The attribute and value that mark a device as a partition of a card (MIG).
    pub partition: Option<(String, String)>,
    /// The attribute naming a partition's profile (`1g.18gb`).
    pub profile: Option<String>,
}

impl DriverModel {
    /// NVIDIA's DRA driver: `productName`, and MIG devices (`type: mig`) by `profile`.
    pub fn nvidia() -> Self {
        Self {
            driver: "gpu.nvidia.com".into(),
            product: "productName".into(),
            partition: Some(("type".into(), "mig".into())),
            profile: Some("profile".into()),
        }
    }

    /// Parses a `DRIVER=ATTRIBUTE` setting: devices of that driver are cards whose
    /// model is that attribute (no partitions).
    pub fn parse(s: &str) -> Result<Self, DraError> {
        match s.split_once('=') {
            Some((d, a)) if !d.trim().is_empty() && !a.trim().is_empty() => Ok(Self {
                driver: d.trim().to_string(),
                product: a.trim().to_string(),
                partition: None,
                profile: None,
            }),
            _ => Err(DraError::Setting {
                value: s.to_string(),
                expected: "DRIVER=ATTRIBUTE, e.g. gpu.example.com=productName".into(),
            }),
        }
    }
}

/// The DRA part of the install's card settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraSettings {
    drivers: Vec<DriverModel>,
    /// DeviceClasses whose requests are card requests.
    classes: BTreeSet<String>,
}

impl Default for DraSettings {
    /// NVIDIA's driver and its two card classes (`gpu.nvidia.com`, `mig.nvidia.com`).
    fn default() -> Self {
        Self {
            drivers: vec![DriverModel::nvidia()],
            classes: ["gpu.nvidia.com", "mig.nvidia.com"]
                .map(String::from)
                .into(),
        }
    }
}

impl DraSettings {
    /// How `driver` names its devices' models, if it publishes cards.
    pub fn driver(&self, driver: &str) -> Option<&DriverModel> {
        self.drivers.iter().find(|d| d.driver == driver)
    }

    /// Whether requests of DeviceClass `class` are card requests.
    pub fn is_card_class(&self, class: &str) -> bool {
        self.classes.contains(class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_setting_names_its_attribute() {
        let d = DriverModel::parse("gpu.example.com=model").unwrap();
        assert_eq!(
            (d.driver.as_str(), d.product.as_str()),
            ("gpu.example.com", "model")
        );
        assert_eq!(
            DriverModel::parse("gpu.example.com").unwrap_err().to_string(),
            "DRA driver setting \"gpu.example.com\": expected DRIVER=ATTRIBUTE, e.g. gpu.example.com=productName"
        );
        let s = DraSettings::default();
        assert!(s.is_card_class("mig.nvidia.com") && !s.is_card_class("nic.example.com"));
        assert_eq!(s.driver("gpu.nvidia.com"), Some(&DriverModel::nvidia()));
    }
}
