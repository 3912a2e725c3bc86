//! Which card models each device requirement held may get, kept up to date device by
//! device. A requirement is one way of a claim's request (a DeviceClass's selectors with
//! the request's own); claims and templates made from one spec share it. A ResourceSlice
//! that joins, changes or leaves costs CEL evaluations of its own devices against each
//! requirement held, never a re-read of every claim against every device (issue 57 #6:
//! 14 s under the snapshot lock for one slice at 128 nodes and 1,000 claims).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::claims::Subrequest;
use super::devices::{Device, DeviceId};
use super::selectors::{Match, Selector};
use crate::cards::names::CardName;

/// A requirement's identity: its DeviceClass and its own selectors' expressions (the
/// class's selectors are the class's: a class change reads everything again).
pub type RequirementKey = (String, Vec<String>);

/// The key of one way of a request.
pub fn key_of(option: &Subrequest) -> RequirementKey {
    let exprs = option
        .selectors
        .iter()
        .map(|s| s.expression().to_string())
        .collect();
    (option.class.clone(), exprs)
}

/// True when `device` may be one `class_selectors` and `selectors` allow: a selector
/// that cannot be decided here counts as a match, so a request's models are never
/// fewer than the scheduler's.
pub fn allows(class_selectors: &[Selector], selectors: &[Selector], device: &Device) -> bool {
    let allowed = |s: &Selector| s.matches(device) != Match::No;
    class_selectors.iter().all(allowed) && selectors.iter().all(allowed)
}

/// The models of the card devices a requirement allows, sorted, once each.
pub fn matching_models<'a>(
    class_selectors: &[Selector],
    selectors: &[Selector],
    devices: impl Iterator<Item = &'a Device>,
) -> Vec<CardName> {
    count_models(class_selectors, selectors, devices)
        .into_keys()
        .collect()
}

/// Card devices `class_selectors` and `selectors` allow, per model.
pub fn count_models<'a>(
    class_selectors: &[Selector],
    selectors: &[Selector],
    devices: impl Iterator<Item = &'a Device>,
) -> BTreeMap<CardName, usize> {
    let mut models: BTreeMap<CardName, usize> = BTreeMap::new();
    for d in devices {
        if let Some(Ok(m)) = &d.model {
            if allows(class_selectors, selectors, d) {
                *models.entry(m.clone()).or_default() += 1;
            }
        }
    }
    models
}

/// Card devices each requirement allows, per model (what [`Matches`] holds of each).
pub type Counts = BTreeMap<RequirementKey, BTreeMap<CardName, usize>>;

/// A requirement's selectors: its DeviceClass's and its own.
#[derive(Debug)]
pub struct Rule {
    class_selectors: Vec<Selector>,
    selectors: Vec<Selector>,
}

impl Rule {
    fn allows(&self, device: &Device) -> bool {
        allows(&self.class_selectors, &self.selectors, device)
    }

    /// The requirement's own selectors (its class's are the class's).
    pub fn selectors(&self) -> &[Selector] {
        &self.selectors
    }
}

/// The requirements held, by key (shared with the views a watcher reads without the
/// lock; a change copies the map only while one is out).
pub type Rules = Arc<BTreeMap<RequirementKey, Arc<Rule>>>;

/// What rules say of card devices, found without the lock by the watcher of a
/// ResourceSlice ([`Verdicts::of`]); under the lock [`Matches::devices_changed`] takes a
/// verdict only for the very rule (the same `Arc`) and the very device it was reached
/// for, and evaluates whatever else is new there.
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    rules: HashMap<RequirementKey, (Arc<Rule>, HashMap<DeviceId, bool>)>,
    devices: HashMap<DeviceId, Device>,
}

impl Verdicts {
    /// Every rule of `rules` on every card device of `devices`.
    pub fn of<'a>(
        rules: &BTreeMap<RequirementKey, Arc<Rule>>,
        devices: impl Iterator<Item = &'a Device>,
    ) -> Self {
        let devices: HashMap<DeviceId, Device> = devices
            .filter(|d| matches!(d.model, Some(Ok(_))))
            .map(|d| (d.id.clone(), d.clone()))
            .collect();
        let rules = rules
            .iter()
            .map(|(key, rule)| {
                let by_device = devices
                    .iter()
                    .map(|(id, d)| (id.clone(), rule.allows(d)))
                    .collect();
                (key.clone(), (Arc::clone(rule), by_device))
            })
            .collect();
        Self { rules, devices }
    }

    fn get(&self, key: &RequirementKey, rule: &Arc<Rule>, device: &Device) -> Option<bool> {
        let (r, by_device) = self.rules.get(key)?;
        if !Arc::ptr_eq(r, rule) || self.devices.get(&device.id) != Some(device) {
            return None;
        }
        by_device.get(&device.id).copied()
    }
}

#[derive(Debug, Clone)]
struct Held {
    rule: Arc<Rule>,
    /// Card devices it allows, per model.
    models: BTreeMap<CardName, usize>,
    /// Claims and templates that use it: at zero it is dropped.
    users: usize,
}

/// The requirements held, and what each allows.
#[derive(Debug, Clone, Default)]
pub struct Matches {
    held: BTreeMap<RequirementKey, Held>,
    /// The rules of `held`, for views.
    rules: Rules,
    /// Requirements counted here against every device (none given counted): the work a
    /// caller holding a lock wants to see stay flat.
    counted_here: u64,
}

impl Matches {
    /// The models `key` allows, sorted; `None` when it is not held.
    pub fn models(&self, key: &RequirementKey) -> Option<Vec<CardName>> {
        let h = self.held.get(key)?;
        Some(h.models.keys().cloned().collect())
    }

    /// One more user of `option` (of a class with `class_selectors`). A new requirement
    /// takes `counted` when given (counted against these very devices, without the
    /// lock: see [`count_models`]), else it is read against every device here.
    pub fn acquire<'a>(
        &mut self,
        option: &Subrequest,
        class_selectors: &[Selector],
        devices: impl Iterator<Item = &'a Device>,
        counted: Option<&BTreeMap<CardName, usize>>,
    ) {
        let counted_here = &mut self.counted_here;
        let rules = &mut self.rules;
        let key = key_of(option);
        let held = self.held.entry(key.clone()).or_insert_with(|| Held {
            rule: {
                let rule = Arc::new(Rule {
                    class_selectors: class_selectors.to_vec(),
                    selectors: option.selectors.clone(),
                });
                Arc::make_mut(rules).insert(key, Arc::clone(&rule));
                rule
            },
            models: match counted {
                Some(c) => c.clone(),
                None => {
                    *counted_here += 1;
                    count_models(class_selectors, &option.selectors, devices)
                }
            },
            users: 0,
        });
        held.users += 1;
    }

    /// One user fewer of `option`'s requirement.
    pub fn release(&mut self, option: &Subrequest) {
        let key = key_of(option);
        if let Some(h) = self.held.get_mut(&key) {
            h.users = h.users.saturating_sub(1);
            if h.users == 0 {
                self.held.remove(&key);
                Arc::make_mut(&mut self.rules).remove(&key);
            }
        }
    }

    /// The rules held (an `Arc`: a view of them costs nothing).
    pub fn rules(&self) -> Rules {
        Arc::clone(&self.rules)
    }

    /// Devices gone and come: each requirement's counts follow, and the keys whose set of
    /// models changed are returned. Costs the changed devices times the requirements:
    /// CEL evaluations, except the verdicts a watcher reached without the lock.
    pub fn devices_changed(
        &mut self,
        gone: &[&Device],
        came: &[&Device],
        verdicts: Option<&Verdicts>,
    ) -> BTreeSet<RequirementKey> {
        let mut changed = BTreeSet::new();
        for (key, h) in &mut self.held {
            let before: Vec<CardName> = h.models.keys().cloned().collect();
            for (devices, add) in [(gone, false), (came, true)] {
                for d in devices {
                    let Some(Ok(m)) = &d.model else { continue };
                    let allowed = verdicts
                        .and_then(|v| v.get(key, &h.rule, d))
                        .unwrap_or_else(|| h.rule.allows(d));
                    if !allowed {
                        continue;
                    }
                    if add {
                        *h.models.entry(m.clone()).or_default() += 1;
                    } else if let Some(n) = h.models.get_mut(m) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            h.models.remove(m);
                        }
                    }
                }
            }
            if h.models.keys().ne(before.iter()) {
                changed.insert(key.clone());
            }
        }
        changed
    }

    /// What every requirement held allows, but those of DeviceClass `class`: a change of
    /// that class changes nothing else (the devices are the same).
    pub fn counts_except(&self, class: &str) -> Counts {
        self.held
            .iter()
            .filter(|(k, _)| k.0 != class)
            .map(|(k, h)| (k.clone(), h.models.clone()))
            .collect()
    }

    /// No requirement held, the count of those counted here kept.
    pub fn cleared(&self) -> Self {
        Self {
            counted_here: self.counted_here,
            ..Self::default()
        }
    }

    /// How many requirements were counted here against every device, so far.
    pub fn counted_here(&self) -> u64 {
        self.counted_here
    }

    /// How many requirements are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::dra::claims::Count;
    use crate::cards::dra::devices::slice_devices;
    use crate::cards::dra::settings::DraSettings;

    fn devices(node: &str, products: &[&str]) -> Vec<Device> {
        let devs: Vec<serde_json::Value> = products
            .iter()
            .enumerate()
            .map(|(i, p)| serde_json::json!({"name": format!("gpu-{i}"), "attributes": {"productName": {"string": p}}}))
            .collect();
        let slice = serde_json::json!({"metadata": {"name": node}, "spec": {"driver": "gpu.nvidia.com",
            "nodeName": node, "pool": {"name": node}, "devices": devs}});
        slice_devices(&slice, &DraSettings::default()).unwrap()
    }

    fn option(selector: Option<&str>) -> Subrequest {
        Subrequest {
            name: "gpu".into(),
            class: "gpu.nvidia.com".into(),
            selectors: selector
                .map(|s| Selector::compile(s, "test").unwrap())
                .into_iter()
                .collect(),
            count: Count::Exact(1),
        }
    }

    #[test]
    fn counts_follow_devices_and_only_a_changed_set_of_models_is_reported() {
        let a = devices("a", &["NVIDIA H200", "NVIDIA H200"]);
        let mut m = Matches::default();
        let any = option(None);
        let h200 = option(Some(
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'",
        ));
        m.acquire(&any, &[], a.iter(), None);
        m.acquire(&h200, &[], a.iter(), None);
        m.acquire(&h200, &[], a.iter(), None);
        assert_eq!(m.len(), 2);
        let h = CardName::parse("NVIDIA-H200").unwrap();
        assert_eq!(m.models(&key_of(&any)), Some(vec![h.clone()]));
        // A node of H200s joins: counts grow, no set of models changes.
        let b = devices("b", &["NVIDIA H200"]);
        assert!(m
            .devices_changed(&[], &b.iter().collect::<Vec<_>>(), None)
            .is_empty());
        // An RTX node joins: only the requirement that allows it changes.
        let c = devices("c", &["NVIDIA GeForce RTX 4090"]);
        let changed = m.devices_changed(&[], &c.iter().collect::<Vec<_>>(), None);
        assert_eq!(changed, BTreeSet::from([key_of(&any)]));
        // Node a leaves: H200s remain on b.
        assert!(m
            .devices_changed(&a.iter().collect::<Vec<_>>(), &[], None)
            .is_empty());
        // b leaves: no H200 is left anywhere.
        let changed = m.devices_changed(&b.iter().collect::<Vec<_>>(), &[], None);
        assert_eq!(changed.len(), 2);
        assert_eq!(m.models(&key_of(&h200)), Some(vec![]));
        // Released by every user, a requirement is dropped.
        m.release(&h200);
        assert_eq!(m.len(), 2);
        m.release(&h200);
        assert_eq!(m.len(), 1);
    }
}
