//! The selector that pins a claim to the card models its pod was admitted for: a CEL
//! expression over the attributes that name a device's model, so that any scheduler
//! allocates only devices of those models.

use super::devices::{Attribute, Device};
use super::settings::DraSettings;
use crate::cards::names::{Alternatives, CardName};

/// A CEL string literal.
fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The condition a device of `model` meets, read from `device` (one published device of
/// that model): its driver, product and, for a partition, its profile.
fn condition(device: &Device, settings: &DraSettings) -> Option<String> {
    let rule = settings.driver(&device.id.driver)?;
    let attr = |name: &str| -> Option<String> {
        let value = device.own(name).and_then(Attribute::text)?;
        Some(format!(
            "device.attributes[{}][{}] == {}",
            literal(&device.id.driver),
            literal(name),
            literal(value)
        ))
    };
    let mut parts = vec![
        format!("device.driver == {}", literal(&device.id.driver)),
        attr(&rule.product)?,
    ];
    let partition = rule
        .partition
        .as_ref()
        .is_some_and(|(a, v)| device.own(a).and_then(Attribute::text) == Some(v.as_str()));
    if let (true, Some(profile)) = (partition, &rule.profile) {
        parts.push(attr(profile)?);
    }
    Some(format!("({})", parts.join(" && ")))
}

/// The selector allowing exactly the devices of `models` among `devices` (every
/// published device): `None` when no published device has one of them (nothing to pin
/// to; the binding's check still holds the line).
pub fn pin_expression<'a>(
    models: &Alternatives,
    devices: impl Iterator<Item = &'a Device>,
    settings: &DraSettings,
) -> Option<String> {
    let mut by_model: std::collections::BTreeMap<&CardName, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for d in devices {
        if let Some(Ok(m)) = &d.model {
            if models.contains(m) {
                if let Some(c) = condition(d, settings) {
                    by_model.entry(m).or_default().insert(c);
                }
            }
        }
    }
    let all: std::collections::BTreeSet<String> = by_model.into_values().flatten().collect();
    if all.is_empty() {
        return None;
    }
    Some(all.into_iter().collect::<Vec<_>>().join(" || "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::dra::devices::slice_devices;
    use crate::cards::dra::selectors::{Match, Selector};
    use serde_json::json;

    #[test]
    fn the_pin_selects_the_devices_of_the_admitted_models_only() {
        let settings = DraSettings::default();
        let s = json!({"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n"},
            "devices": [
                {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}}},
                {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA GeForce RTX 4090"}}},
                {"name": "gpu-2-mig", "attributes": {"type": {"string": "mig"}, "productName": {"string": "NVIDIA H200"}, "profile": {"string": "1g.18gb"}}},
                {"name": "gpu-3-mig", "attributes": {"type": {"string": "mig"}, "productName": {"string": "NVIDIA H200"}, "profile": {"string": "3g.71gb"}}}]}});
        let devices = slice_devices(&s, &settings).unwrap();
        let pin = |models: &str| {
            let a = Alternatives::parse(models).unwrap();
            let e = pin_expression(&a, devices.iter(), &settings).unwrap();
            let sel = Selector::compile(&e, "pin").unwrap();
            devices
                .iter()
                .filter(|d| sel.matches(d) == Match::Yes)
                .map(|d| d.id.name.clone())
                .collect::<Vec<_>>()
        };
        // A whole-card model's condition also holds for its partitions: the request's
        // DeviceClass (gpu or mig) tells them apart.
        assert_eq!(pin("NVIDIA-H200"), ["gpu-0", "gpu-2-mig", "gpu-3-mig"]);
        assert_eq!(pin("NVIDIA-H200/mig-1g.18gb-mixed"), ["gpu-2-mig"]);
        assert_eq!(
            pin("NVIDIA-GeForce-RTX-4090|NVIDIA-H200/mig-3g.71gb-mixed"),
            ["gpu-1", "gpu-3-mig"]
        );
        let none = Alternatives::parse("NVIDIA-B200").unwrap();
        assert_eq!(pin_expression(&none, devices.iter(), &settings), None);
        assert_eq!(literal("it's \\"), "'it\\'s \\\\'");
    }
}
