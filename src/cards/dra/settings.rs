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
            driver: NVIDIA_DRIVER.into(),
            product: "productName".into(),
            partition: Some(("type".into(), "mig".into())),
            profile: Some("profile".into()),
        }
    }

    /// HAMi's DRA driver (HAMi-core): `productName`, as NVIDIA's (shares of a card are
    /// charged as the card's model, as HAMi's device plugin's are).
    pub fn hami() -> Self {
        Self {
            driver: HAMI_DRIVER.into(),
            product: "productName".into(),
            partition: None,
            profile: None,
        }
    }

    /// Parses a `--dra-driver` setting: a driver card-quota knows by name
    /// (`gpu.nvidia.com`, `hami-core-gpu.project-hami.io`), or `DRIVER=ATTRIBUTE`:
    /// devices of that driver are cards whose model is that attribute (no partitions).
    pub fn parse(s: &str) -> Result<Self, DraError> {
        match s.split_once('=') {
            None if s.trim() == NVIDIA_DRIVER => Ok(Self::nvidia()),
            None if s.trim() == HAMI_DRIVER => Ok(Self::hami()),
            Some((d, a)) if is_qualified(d.trim()) && is_attribute(a.trim()) => Ok(Self {
                driver: d.trim().to_string(),
                product: a.trim().to_string(),
                partition: None,
                profile: None,
            }),
            _ => Err(DraError::Setting {
                value: s.to_string(),
                expected: format!(
                    "DRIVER=ATTRIBUTE (a driver's DNS name and its product attribute, e.g. gpu.example.com=productName), or one of {NVIDIA_DRIVER}, {HAMI_DRIVER}"
                ),
            }),
        }
    }
}

impl DriverModel {
    /// The `--dra-driver` setting that gives this driver back.
    pub fn setting(&self) -> String {
        if *self == Self::nvidia() || *self == Self::hami() {
            self.driver.clone()
        } else {
            format!("{}={}", self.driver, self.product)
        }
    }
}

/// NVIDIA's DRA driver, and the DeviceClass of its whole cards.
pub const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
/// HAMi's DRA driver, and the DeviceClass its chart installs.
pub const HAMI_DRIVER: &str = "hami-core-gpu.project-hami.io";
/// The card DeviceClasses of an install that names none: NVIDIA's whole cards and MIG
/// devices, HAMi's cards.
pub const DEFAULT_CLASSES: &[&str] = &[NVIDIA_DRIVER, "mig.nvidia.com", HAMI_DRIVER];

/// A DNS subdomain, as driver and DeviceClass names are.
fn is_qualified(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A device attribute's name (a C identifier, as the API allows unqualified).
fn is_attribute(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The DRA part of the install's card settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraSettings {
    drivers: Vec<DriverModel>,
    /// DeviceClasses whose requests are card requests.
    classes: BTreeSet<String>,
}

impl Default for DraSettings {
    /// NVIDIA's and HAMi's drivers and their card classes ([`DEFAULT_CLASSES`]).
    fn default() -> Self {
        Self {
            drivers: vec![DriverModel::nvidia(), DriverModel::hami()],
            classes: DEFAULT_CLASSES.iter().map(|c| c.to_string()).collect(),
        }
    }
}

impl DraSettings {
    /// The settings `--dra-driver` and `--dra-class` give; each list given replaces its
    /// defaults, and a list left empty keeps them.
    pub fn parse<S: AsRef<str>>(drivers: &[S], classes: &[S]) -> Result<Self, DraError> {
        let mut out = Self::default();
        if !drivers.is_empty() {
            out.drivers.clear();
            for d in drivers {
                let d = DriverModel::parse(d.as_ref())?;
                if out.driver(&d.driver).is_some() {
                    return Err(DraError::Setting {
                        value: d.driver,
                        expected: "each driver once".into(),
                    });
                }
                out.drivers.push(d);
            }
        }
        if !classes.is_empty() {
            out.classes.clear();
            for c in classes {
                let c = c.as_ref().trim();
                if !is_qualified(c) {
                    return Err(DraError::Setting {
                        value: c.to_string(),
                        expected: "a DeviceClass name (a DNS subdomain, e.g. gpu.nvidia.com)"
                            .into(),
                    });
                }
                out.classes.insert(c.to_string());
            }
        }
        Ok(out)
    }

    /// The drivers whose devices are cards.
    pub fn drivers(&self) -> &[DriverModel] {
        &self.drivers
    }

    /// The card DeviceClasses.
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.classes.iter().map(String::as_str)
    }

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
    fn a_driver_setting_names_its_attribute_or_a_known_driver() {
        let d = DriverModel::parse("gpu.example.com=model").unwrap();
        assert_eq!(
            (d.driver.as_str(), d.product.as_str()),
            ("gpu.example.com", "model")
        );
        assert_eq!(
            DriverModel::parse("gpu.nvidia.com").unwrap(),
            DriverModel::nvidia()
        );
        assert_eq!(
            DriverModel::parse(HAMI_DRIVER).unwrap(),
            DriverModel::hami()
        );
        for bad in [
            "gpu.example.com",
            "Gpu.Example=model",
            "gpu.example.com=bad-attr",
            "=x",
        ] {
            let e = DriverModel::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("DRA setting {bad:?}: expected DRIVER=ATTRIBUTE")),
                "{e}"
            );
        }
        let s = DraSettings::default();
        assert!(s.is_card_class("mig.nvidia.com") && !s.is_card_class("nic.example.com"));
        assert!(s.is_card_class(HAMI_DRIVER));
        assert_eq!(s.driver("gpu.nvidia.com"), Some(&DriverModel::nvidia()));
    }

    #[test]
    fn a_list_given_replaces_its_defaults_and_an_empty_one_keeps_them() {
        let s = DraSettings::parse(&["gpu.example.com=model"], &[]).unwrap();
        assert!(s.driver("gpu.nvidia.com").is_none() && s.driver("gpu.example.com").is_some());
        assert!(s.is_card_class("gpu.nvidia.com"), "classes kept");
        let s = DraSettings::parse(&[], &["gpu.example.com"]).unwrap();
        assert!(s.is_card_class("gpu.example.com") && !s.is_card_class("gpu.nvidia.com"));
        assert_eq!(s.drivers(), DraSettings::default().drivers());
        assert_eq!(
            DraSettings::parse(&[], &["GPU"]).unwrap_err().to_string(),
            "DRA setting \"GPU\": expected a DeviceClass name (a DNS subdomain, e.g. gpu.nvidia.com)"
        );
        assert_eq!(
            DraSettings::parse(&["gpu.nvidia.com", "gpu.nvidia.com=productName"], &[])
                .unwrap_err()
                .to_string(),
            "DRA setting \"gpu.nvidia.com\": expected each driver once"
        );
    }
}
