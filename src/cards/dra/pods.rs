//! A pod's cards through its ResourceClaims: which claims it uses (`spec.resourceClaims`,
//! and from its status the claims made for it from templates), and what they add up to.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::claims::{
    allocated_models, claim_demand, ClaimRecord, ClaimSpec, DeviceClass, RequestDemand, Subrequest,
};
use super::devices::{Device, DeviceId};
use super::matches::{count_models, key_of, matching_models, Counts, Matches, Rules, Verdicts};
use super::selectors::{Match, Selector};
use super::settings::DraSettings;
use super::DraError;
use crate::cards::names::{Alternatives, CardName, ObjectKey};
use crate::cards::quantity::Cards;

/// Where one of a pod's claims comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimSource {
    /// `resourceClaimName`: a claim made apart, which several pods may share.
    Claim(String),
    /// `resourceClaimTemplateName`: a claim made for this pod alone, named in the pod's
    /// `status.resourceClaimStatuses` once made.
    Template {
        template: String,
        made: Option<String>,
    },
}

/// One entry of a pod's `spec.resourceClaims`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodClaim {
    /// The name the pod's containers use for it.
    pub name: String,
    pub source: ClaimSource,
}

impl PodClaim {
    /// The ResourceClaim object this entry uses, once known.
    pub fn claim_name(&self) -> Option<&str> {
        match &self.source {
            ClaimSource::Claim(c) => Some(c),
            ClaimSource::Template { made, .. } => made.as_deref(),
        }
    }
}

/// Builds the pod's claims from `spec.resourceClaims` entries (name, claim, template)
/// and `status.resourceClaimStatuses` (name, claim made). An entry naming neither a
/// claim nor a template is an error (the API server refuses such a pod).
pub fn pod_claims<'a>(
    entries: impl IntoIterator<Item = (&'a str, Option<&'a str>, Option<&'a str>)>,
    made: &BTreeMap<&str, &str>,
) -> Vec<PodClaim> {
    entries
        .into_iter()
        .filter_map(|(name, claim, template)| {
            let source = match (claim, template) {
                (Some(c), _) if !c.is_empty() => ClaimSource::Claim(c.to_string()),
                (_, Some(t)) if !t.is_empty() => ClaimSource::Template {
                    template: t.to_string(),
                    made: made.get(name).map(|m| m.to_string()),
                },
                _ => return None,
            };
            Some(PodClaim {
                name: name.to_string(),
                source,
            })
        })
        .collect()
}

/// The suffix of Kubernetes' ResourceQuota name for the devices of a DeviceClass
/// (`gpu.nvidia.com.deviceclass.resource.k8s.io/devices`): card-quota names a pod's
/// claimed cards by it, where an extended resource would be.
const CLAIM_RESOURCE_SUFFIX: &str = ".deviceclass.resource.k8s.io/devices";

/// The resource name a pod's cards from claims of DeviceClass `class` are shown under.
pub fn claim_resource(class: &str) -> String {
    format!("{class}{CLAIM_RESOURCE_SUFFIX}")
}

/// True for a name [`claim_resource`] gives.
pub fn is_claim_resource(resource: &str) -> bool {
    resource.ends_with(CLAIM_RESOURCE_SUFFIX)
}

/// What a pod's claims add up to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCards {
    /// The DeviceClass of its first card request, as a resource name ([`claim_resource`]).
    pub resource: String,
    /// Cards over every card request of its claims (a shared claim another pod pays
    /// for counts nothing here), on the model where they are the most.
    pub cards: Cards,
    /// The models every one of its card requests may get, preferred first: a pod runs
    /// on one model.
    pub models: Alternatives,
    /// Per model of `models`: its cards there (a `firstAvailable` request counted by
    /// its largest way that may get the model).
    pub per_model: BTreeMap<CardName, Cards>,
    /// Once every one of its card claims is allocated: cards per model allocated.
    pub allocated: Option<Vec<(CardName, Cards)>>,
    /// The claim objects it pays for (for the binding's message).
    pub claims: Vec<String>,
}

impl ClaimCards {
    /// Its cards when it runs on one of `models` (its card name; `None`: any of
    /// [`Self::models`]): the most on any of them. A pod whose claims allow two H200 or
    /// else one GPU of any model, named for an RTX 4090 only, takes one card.
    pub fn cards_on(&self, models: Option<&Alternatives>) -> Cards {
        let Some(models) = models else {
            return self.cards;
        };
        models
            .models()
            .iter()
            .filter_map(|m| self.per_model.get(m).copied())
            .max()
            .unwrap_or(self.cards)
    }
}

/// A claim or template's card demand, read once when it (or the devices and classes
/// it is read against) changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Demand {
    /// Per card request.
    requests: Vec<RequestDemand>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct TemplateEntry {
    spec: Result<ClaimSpec, DraError>,
    demand: Result<Demand, DraError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ClaimEntry {
    record: ClaimRecord,
    demand: Result<Demand, DraError>,
    /// Models per card request of its allocation.
    allocated: Option<Result<Vec<(String, CardName)>, DraError>>,
}

/// The DRA objects the decisions read: DeviceClasses, ResourceClaimTemplates,
/// ResourceClaims and published devices, with each claim's and template's card demand
/// kept up to date as they change.
#[derive(Debug, Clone)]
pub struct DraObjects {
    settings: DraSettings,
    classes: BTreeMap<String, DeviceClass>,
    /// The classes whose requests ask for cards (`card_classes_now`): those the install
    /// lists and those `class_cards` counts devices for.
    card_classes: BTreeSet<String>,
    /// How many devices of a card driver each class may select, kept device by device.
    class_cards: BTreeMap<String, usize>,
    /// Devices by slice, and by id for allocations (shared with [`DraView`]s: a change
    /// copies the map only while one is out).
    slices: Arc<BTreeMap<String, Vec<Device>>>,
    devices: Arc<BTreeMap<DeviceId, Device>>,
    /// Counts the changes of devices and classes: a [`Prepared`] count is taken only at
    /// the generation it was counted at.
    generation: u64,
    /// The models each way of a card request held may get, kept device by device.
    matches: Matches,
    templates: BTreeMap<ObjectKey, TemplateEntry>,
    claims: BTreeMap<ObjectKey, ClaimEntry>,
}

/// What a change of devices made worth reading again: the pods that use these claims
/// or templates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reread {
    pub claims: BTreeSet<ObjectKey>,
    pub templates: BTreeSet<ObjectKey>,
}

/// What a claim's or template's requirements are read against, taken under the lock in
/// O(classes) and used without it: a new requirement is counted against every device
/// there, so that no decision waits on it (issue 57 #6).
#[derive(Debug, Clone)]
pub struct DraView {
    generation: u64,
    settings: DraSettings,
    classes: BTreeMap<String, DeviceClass>,
    devices: Arc<BTreeMap<DeviceId, Device>>,
    slices: Arc<BTreeMap<String, Vec<Device>>>,
    rules: Rules,
}

/// What a watcher worked out against a [`DraView`] without the lock: a claim's or
/// template's requirements counted ([`DraObjects::upsert_claim`] and
/// [`DraObjects::upsert_template`] take them when no device or class changed since), or
/// a slice's changed devices judged by every requirement ([`DraObjects::upsert_slice`]
/// takes each verdict reached for the very requirement and device it meets), or a
/// DeviceClass's new selectors counted ([`DraObjects::upsert_class`] takes them when no
/// device or class changed since).
#[derive(Debug, Clone)]
pub enum Prepared {
    Counted {
        generation: u64,
        counted: Counts,
    },
    Slice(Verdicts),
    Class {
        generation: u64,
        class: String,
        /// Card devices the class may select (0 for a class deleted).
        selects: usize,
        /// The requirements of the class held, counted with its new selectors.
        counted: Counts,
    },
}

impl DraView {
    /// The install's DRA settings (to read slices with).
    pub fn settings(&self) -> &DraSettings {
        &self.settings
    }

    /// Counts every way of `spec` (of a card class or not yet: see
    /// `DraObjects::remember`) against every card device of the view.
    pub fn prepare(&self, spec: &ClaimSpec) -> Prepared {
        let mut counted = BTreeMap::new();
        for o in spec.options() {
            let class = self
                .classes
                .get(&o.class)
                .map(|c| c.selectors.as_slice())
                .unwrap_or_default();
            counted
                .entry(key_of(o))
                .or_insert_with(|| count_models(class, &o.selectors, self.devices.values()));
        }
        Prepared::Counted {
            generation: self.generation,
            counted,
        }
    }

    /// Counts what DeviceClass `name` becoming `class` (`None`: deleted) changes: the card
    /// devices it may select, and what each requirement of it held allows with its new
    /// selectors.
    pub fn prepare_class(&self, name: &str, class: Option<&DeviceClass>) -> Prepared {
        let class_selectors = class.map(|c| c.selectors.as_slice()).unwrap_or_default();
        let selects = class.map_or(0, |c| {
            self.devices
                .values()
                .filter(|d| c.may_select_a_card(d))
                .count()
        });
        let counted = self
            .rules
            .iter()
            .filter(|(k, _)| k.0 == name)
            .map(|(k, rule)| {
                let models = count_models(class_selectors, rule.selectors(), self.devices.values());
                (k.clone(), models)
            })
            .collect();
        Prepared::Class {
            generation: self.generation,
            class: name.to_string(),
            selects,
            counted,
        }
    }

    /// Judges the devices a slice `name` now publishing `devices` adds or takes away by
    /// every requirement held (a node joining: its own devices times the requirements).
    pub fn prepare_slice(&self, name: &str, devices: &[Device]) -> Prepared {
        let old = self.slices.get(name).map(Vec::as_slice).unwrap_or_default();
        let changed = old
            .iter()
            .filter(|d| !devices.contains(d))
            .chain(devices.iter().filter(|d| !old.contains(d)));
        Prepared::Slice(Verdicts::of(&self.rules, changed))
    }
}

impl Reread {
    /// True when a pod of `namespace` with `claims` may read otherwise now.
    pub fn touches(&self, namespace: &str, claims: &[PodClaim]) -> bool {
        claims.iter().any(|c| {
            let named =
                |set: &BTreeSet<ObjectKey>, name: &str| set.contains(&ObjectKey::new(namespace, name));
            c.claim_name().is_some_and(|n| named(&self.claims, n))
                || matches!(&c.source, ClaimSource::Template { template, .. } if named(&self.templates, template))
        })
    }
}

/// No objects yet, read with the default settings. (Derived, the card classes of the
/// settings were missing until a slice or a class changed: a template read before that
/// asked for no card.)
impl Default for DraObjects {
    fn default() -> Self {
        Self::new(DraSettings::default())
    }
}

impl DraObjects {
    /// No objects yet, read with `settings`.
    pub fn new(settings: DraSettings) -> Self {
        Self {
            card_classes: settings.classes().map(str::to_string).collect(),
            settings,
            classes: BTreeMap::new(),
            class_cards: BTreeMap::new(),
            slices: Arc::default(),
            devices: Arc::default(),
            generation: 0,
            matches: Matches::default(),
            templates: BTreeMap::new(),
            claims: BTreeMap::new(),
        }
    }

    /// Whether requests of DeviceClass `class` ask for cards: a class the install lists,
    /// or one whose selectors may match a card driver's device ([`card_classes`]).
    pub fn is_card_class(&self, class: &str) -> bool {
        self.card_classes.contains(class) || self.settings.is_card_class(class)
    }

    pub fn settings(&self) -> &DraSettings {
        &self.settings
    }

    pub fn slices(&self) -> &BTreeMap<String, Vec<Device>> {
        &self.slices
    }

    /// Adds or replaces one slice's devices: what to read again, `None` when nothing
    /// changed. Costs the slice's own devices (CEL against each requirement held, but
    /// for the verdicts `prepared` brings) and map lookups over the claims, never every
    /// claim against every device.
    pub fn upsert_slice(
        &mut self,
        name: String,
        devices: Vec<Device>,
        prepared: Option<&Prepared>,
    ) -> Option<Reread> {
        if self.slices.get(&name) == Some(&devices) {
            return None;
        }
        let old = Arc::make_mut(&mut self.slices)
            .remove(&name)
            .unwrap_or_default();
        let held = Arc::make_mut(&mut self.devices);
        for d in &old {
            held.remove(&d.id);
        }
        for d in &devices {
            held.insert(d.id.clone(), d.clone());
        }
        let gone: Vec<Device> = old
            .iter()
            .filter(|d| !devices.contains(d))
            .cloned()
            .collect();
        let came: Vec<Device> = devices
            .iter()
            .filter(|d| !old.contains(d))
            .cloned()
            .collect();
        Arc::make_mut(&mut self.slices).insert(name, devices);
        let verdicts = match prepared {
            Some(Prepared::Slice(v)) => Some(v),
            _ => None,
        };
        Some(self.devices_changed(&gone, &came, verdicts))
    }

    /// Forgets a slice: what to read again, `None` when it was not held. `prepared`: its
    /// devices judged by the watcher without the lock ([`DraView::prepare_slice`] of no
    /// devices).
    pub fn remove_slice(&mut self, name: &str, prepared: Option<&Prepared>) -> Option<Reread> {
        let old = Arc::make_mut(&mut self.slices).remove(name)?;
        let held = Arc::make_mut(&mut self.devices);
        for d in &old {
            held.remove(&d.id);
        }
        let verdicts = match prepared {
            Some(Prepared::Slice(v)) => Some(v),
            _ => None,
        };
        Some(self.devices_changed(&old, &[], verdicts))
    }

    /// Adds or replaces a DeviceClass; false when nothing changed. Every demand is read
    /// again; what the class's requirements allow is counted against every device here
    /// unless `prepared` brings it ([`DraView::prepare_class`], of this generation).
    pub fn upsert_class(&mut self, class: DeviceClass, prepared: Option<&Prepared>) -> bool {
        if self.classes.get(&class.name) == Some(&class) {
            return false;
        }
        let name = class.name.clone();
        self.classes.insert(name.clone(), class);
        self.class_changed(&name, prepared);
        true
    }

    /// Forgets a DeviceClass (see [`Self::upsert_class`] for `prepared`).
    pub fn remove_class(&mut self, name: &str, prepared: Option<&Prepared>) -> bool {
        let gone = self.classes.remove(name).is_some();
        if gone {
            self.class_changed(name, prepared);
        }
        gone
    }

    /// DeviceClass `name` changed (or went): its count of card devices, then every
    /// demand read again, requirements of other classes keeping what they allow.
    fn class_changed(&mut self, name: &str, prepared: Option<&Prepared>) {
        let given = match prepared {
            Some(Prepared::Class {
                generation,
                class,
                selects,
                counted,
            }) if *generation == self.generation && class == name => Some((*selects, counted)),
            _ => None,
        };
        match self.classes.get(name) {
            Some(c) => {
                let selects = given.map(|(n, _)| n).unwrap_or_else(|| {
                    self.devices
                        .values()
                        .filter(|d| c.may_select_a_card(d))
                        .count()
                });
                self.class_cards.insert(name.to_string(), selects);
            }
            None => {
                self.class_cards.remove(name);
            }
        }
        let mut counts = self.matches.counts_except(name);
        if let Some((_, counted)) = given {
            counts.extend(counted.iter().map(|(k, m)| (k.clone(), m.clone())));
        }
        self.reread(&counts);
    }

    /// Adds or replaces a ResourceClaimTemplate (its `spec.spec` read already), with its
    /// requirements counted without the lock when `prepared` is of this generation.
    pub fn upsert_template(
        &mut self,
        key: ObjectKey,
        spec: Result<ClaimSpec, DraError>,
        prepared: Option<&Prepared>,
    ) {
        // Held before the old one lets go: an unchanged requirement is not counted again.
        self.remember(&spec, self.counted(prepared));
        if let Some(old) = self.templates.remove(&key) {
            self.forget(&old.spec);
        }
        let demand = self.demand_of(&spec, &format!("ResourceClaimTemplate {key}"));
        self.templates.insert(key, TemplateEntry { spec, demand });
    }

    pub fn remove_template(&mut self, key: &ObjectKey) -> bool {
        let Some(old) = self.templates.remove(key) else {
            return false;
        };
        self.forget(&old.spec);
        true
    }

    /// Adds or replaces a ResourceClaim (see [`Self::upsert_template`] for `prepared`);
    /// false when nothing card-quota reads changed.
    pub fn upsert_claim(&mut self, record: ClaimRecord, prepared: Option<&Prepared>) -> bool {
        if let Some(held) = self.claims.get_mut(&record.key) {
            if held.record.reads_as(&record) {
                held.record.resource_version = record.resource_version;
                return false;
            }
        }
        // Held before the old one lets go: a status write (an allocation, a reservation)
        // counts no requirement again.
        self.remember(&record.spec, self.counted(prepared));
        if let Some(old) = self.claims.remove(&record.key) {
            self.forget(&old.record.spec);
        }
        let entry = self.entry(record);
        self.claims.insert(entry.record.key.clone(), entry);
        true
    }

    pub fn remove_claim(&mut self, key: &ObjectKey) -> bool {
        let Some(old) = self.claims.remove(key) else {
            return false;
        };
        self.forget(&old.record.spec);
        true
    }

    /// Every claim held, by key.
    pub fn claim_keys(&self) -> Vec<ObjectKey> {
        self.claims.keys().cloned().collect()
    }

    /// Every DeviceClass held, by name.
    pub fn class_names(&self) -> Vec<String> {
        self.classes.keys().cloned().collect()
    }

    /// Every template held, by key.
    pub fn template_keys(&self) -> Vec<ObjectKey> {
        self.templates.keys().cloned().collect()
    }

    /// The card models `record`'s allocation gave (each once, in its order), read
    /// against the devices held; `None` while it is not allocated.
    pub fn allocation_models(
        &self,
        record: &ClaimRecord,
    ) -> Option<Result<Vec<CardName>, DraError>> {
        let results = match record.allocation.as_ref()? {
            Ok(r) => r,
            Err(e) => return Some(Err(e.clone())),
        };
        let object = format!("ResourceClaim {}", record.key);
        let got = allocated_models(results, &object, &self.settings, |id| self.devices.get(id));
        Some(got.map(|got| {
            let mut models: Vec<CardName> = Vec::new();
            for (_, m) in got {
                if !models.contains(&m) {
                    models.push(m);
                }
            }
            models
        }))
    }

    /// A held claim.
    pub fn claim(&self, key: &ObjectKey) -> Option<&ClaimRecord> {
        self.claims.get(key).map(|e| &e.record)
    }

    /// The cards `node` offers through DRA-backed extended resources (DeviceClasses with
    /// `extendedResourceName`), by that resource: the model and count of the card devices
    /// its slices publish that the class may select, or, when they are of several models,
    /// a problem naming them (a pod asking for the resource could get either: nothing
    /// is pinned to or charged on it).
    pub fn extended_cards(&self, node: &str) -> BTreeMap<String, Result<(CardName, u64), String>> {
        let mut found: BTreeMap<&str, BTreeMap<&CardName, u64>> = BTreeMap::new();
        let on_node = self
            .slices
            .values()
            .flatten()
            .filter(|d| d.node.as_deref() == Some(node));
        for d in on_node {
            let Some(Ok(model)) = &d.model else { continue };
            for c in self.classes.values() {
                let Some(resource) = &c.extended_resource else {
                    continue;
                };
                if c.selectors.iter().all(|s| s.matches(d) != Match::No) {
                    *found.entry(resource).or_default().entry(model).or_default() += 1;
                }
            }
        }
        found
            .into_iter()
            .map(|(resource, models)| {
                let got = match models.iter().collect::<Vec<_>>().as_slice() {
                    [(m, n)] => Ok(((**m).clone(), **n)),
                    several => Err(format!(
                        "{resource} is served through DRA by devices of several models ({}): card-quota cannot tell which a pod gets",
                        several.iter().map(|(m, n)| format!("{n} {m}")).collect::<Vec<_>>().join(", ")
                    )),
                };
                (resource.to_string(), got)
            })
            .collect()
    }

    /// The model of every published device that has one (with repeats).
    pub fn device_models(&self) -> impl Iterator<Item = &CardName> + '_ {
        self.devices.values().filter_map(|d| match &d.model {
            Some(Ok(m)) => Some(m),
            _ => None,
        })
    }

    /// Every published device whose model is one of `models`.
    pub fn devices_of<'a>(
        &'a self,
        models: &'a Alternatives,
    ) -> impl Iterator<Item = &'a Device> + 'a {
        self.devices
            .values()
            .filter(|d| matches!(&d.model, Some(Ok(m)) if models.contains(m)))
    }

    /// The selectors of DeviceClass `class` (none for a class not held).
    fn class_selectors(&self, class: &str) -> &[Selector] {
        self.classes
            .get(class)
            .map(|c| c.selectors.as_slice())
            .unwrap_or_default()
    }

    /// What `prepared` counted, when it was counted at this generation.
    fn counted<'p>(&self, prepared: Option<&'p Prepared>) -> Option<&'p Counts> {
        match prepared {
            Some(Prepared::Counted {
                generation,
                counted,
            }) if *generation == self.generation => Some(counted),
            _ => None,
        }
    }

    /// Holds what `spec`'s ways may get, kept as devices change; a requirement
    /// `prepared` counted takes what it allows from there. Every way is held, of a card
    /// class or not yet: a class that comes to select cards (its model's first node
    /// joining an autoscaled pool) then has its requirements counted already, and its
    /// claims are read again without counting anything under the lock.
    fn remember(&mut self, spec: &Result<ClaimSpec, DraError>, prepared: Option<&Counts>) {
        let Ok(spec) = spec else { return };
        let options: Vec<Subrequest> = spec.options().cloned().collect();
        for o in &options {
            let class = self.class_selectors(&o.class).to_vec();
            let counted = prepared.and_then(|p| p.get(&key_of(o)));
            self.matches
                .acquire(o, &class, self.devices.values(), counted);
        }
    }

    /// How many requirements were counted against every device by this holder (not
    /// given counted by a watcher), so far.
    pub fn requirements_counted_here(&self) -> u64 {
        self.matches.counted_here()
    }

    /// What a claim's requirements may be counted against without the lock.
    pub fn view(&self) -> DraView {
        DraView {
            generation: self.generation,
            settings: self.settings.clone(),
            classes: self.classes.clone(),
            devices: Arc::clone(&self.devices),
            slices: Arc::clone(&self.slices),
            rules: self.matches.rules(),
        }
    }

    fn forget(&mut self, spec: &Result<ClaimSpec, DraError>) {
        let Ok(spec) = spec else { return };
        for o in spec.options() {
            self.matches.release(o);
        }
    }

    fn demand_of(
        &self,
        spec: &Result<ClaimSpec, DraError>,
        object: &str,
    ) -> Result<Demand, DraError> {
        let spec = spec.as_ref().map_err(Clone::clone)?;
        // A way not held (a claim as a status write would make it) is read against
        // every device.
        let models_of = |o: &Subrequest| {
            self.matches.models(&key_of(o)).unwrap_or_else(|| {
                matching_models(
                    self.class_selectors(&o.class),
                    &o.selectors,
                    self.devices.values(),
                )
            })
        };
        let requests = claim_demand(spec, object, &self.card_classes, models_of)?;
        Ok(Demand { requests })
    }

    fn entry(&self, record: ClaimRecord) -> ClaimEntry {
        let object = format!("ResourceClaim {}", record.key);
        let demand = self.demand_of(&record.spec, &object);
        let allocated = record.allocation.as_ref().map(|a| {
            let results = a.as_ref().map_err(Clone::clone)?;
            allocated_models(results, &object, &self.settings, |id| self.devices.get(id))
        });
        ClaimEntry {
            record,
            demand,
            allocated,
        }
    }

    /// A class changed: which classes ask for cards, what every way may get and every
    /// demand are read again; a requirement
    /// `counts` holds takes what it allows from there, any other is counted here.
    /// (`class_cards` is the caller's to keep.)
    fn reread(&mut self, counts: &Counts) {
        self.card_classes = self.card_classes_now();
        self.generation += 1;
        self.matches = self.matches.cleared();
        let templates = std::mem::take(&mut self.templates);
        for (k, t) in templates {
            self.remember(&t.spec, Some(counts));
            let demand = self.demand_of(&t.spec, &format!("ResourceClaimTemplate {k}"));
            let spec = t.spec;
            self.templates.insert(k, TemplateEntry { spec, demand });
        }
        let claims = std::mem::take(&mut self.claims);
        for (k, e) in claims {
            self.remember(&e.record.spec, Some(counts));
            let entry = self.entry(e.record);
            self.claims.insert(k, entry);
        }
    }

    /// The DeviceClasses whose requests are card requests: those the install lists
    /// (`--dra-class`), and every other DeviceClass of the cluster whose selectors may
    /// match a device of a card driver (an admin's own class selecting the NVIDIA
    /// driver's H200s): a card is counted however it is asked for, as its allocation is
    /// checked by driver.
    fn card_classes_now(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.settings.classes().map(str::to_string).collect();
        out.extend(
            self.class_cards
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(c, _)| c.clone()),
        );
        out
    }

    /// Devices `gone` and `came` (a slice's change): counts follow them; the claims and
    /// templates whose demand or allocation they change are read again, with those of a
    /// class that comes to select cards or stops (its requirements are held and counted
    /// already: nothing is counted against every device here).
    fn devices_changed(
        &mut self,
        gone: &[Device],
        came: &[Device],
        verdicts: Option<&Verdicts>,
    ) -> Reread {
        self.generation += 1;
        for c in self.classes.values() {
            let n = self.class_cards.entry(c.name.clone()).or_default();
            let selects = |d: &&Device| c.may_select_a_card(d);
            *n = n.saturating_sub(gone.iter().filter(selects).count());
            *n += came.iter().filter(selects).count();
        }
        let now = self.card_classes_now();
        let flipped: BTreeSet<String> = now
            .symmetric_difference(&self.card_classes)
            .cloned()
            .collect();
        self.card_classes = now;
        let gone_refs: Vec<&Device> = gone.iter().collect();
        let came_refs: Vec<&Device> = came.iter().collect();
        let keys = self
            .matches
            .devices_changed(&gone_refs, &came_refs, verdicts);
        let ids: BTreeSet<&DeviceId> = gone.iter().chain(came).map(|d| &d.id).collect();
        let uses_changed = |spec: &Result<ClaimSpec, DraError>| {
            spec.as_ref().is_ok_and(|s| {
                s.options()
                    .any(|o| flipped.contains(&o.class) || keys.contains(&key_of(o)))
            })
        };
        let templates = self
            .templates
            .iter()
            .filter(|(_, t)| uses_changed(&t.spec))
            .map(|(k, _)| k.clone())
            .collect();
        let claims = self
            .claims
            .iter()
            .filter(|(_, e)| {
                uses_changed(&e.record.spec)
                    || matches!(&e.record.allocation, Some(Ok(a)) if a.iter().any(|r| ids.contains(&r.device)))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let out = Reread { claims, templates };
        for k in &out.templates {
            if let Some(t) = self.templates.get(k) {
                let demand = self.demand_of(&t.spec, &format!("ResourceClaimTemplate {k}"));
                if let Some(t) = self.templates.get_mut(k) {
                    t.demand = demand;
                }
            }
        }
        for k in &out.claims {
            if let Some(e) = self.claims.remove(k) {
                let entry = self.entry(e.record);
                self.claims.insert(k.clone(), entry);
            }
        }
        out
    }

    /// What `pod`'s claims add up to: `None` when none of them asks for a card. A claim
    /// shared by several pods is paid by one: the pod `payer` names for it (the caller
    /// knows which of its pods are bound). A claim or template not held yet,
    /// a claim that cannot be read, or card requests that share no model are errors: the
    /// caller refuses or fails closed.
    pub fn pod_cards(
        &self,
        pod: &ObjectKey,
        claims: &[PodClaim],
        payer: impl Fn(&ClaimRecord) -> Option<String>,
    ) -> Result<Option<ClaimCards>, DraError> {
        self.pod_cards_over(pod, claims, payer, None)
    }

    /// [`Self::pod_cards`] as if `claim` were held as it reads: what a claim's status
    /// write would make of its pod.
    pub fn pod_cards_if(
        &self,
        pod: &ObjectKey,
        claims: &[PodClaim],
        payer: impl Fn(&ClaimRecord) -> Option<String>,
        claim: ClaimRecord,
    ) -> Result<Option<ClaimCards>, DraError> {
        let entry = self.entry(claim);
        self.pod_cards_over(pod, claims, payer, Some(&entry))
    }

    fn pod_cards_over(
        &self,
        pod: &ObjectKey,
        claims: &[PodClaim],
        payer: impl Fn(&ClaimRecord) -> Option<String>,
        over: Option<&ClaimEntry>,
    ) -> Result<Option<ClaimCards>, DraError> {
        let mut requests: Vec<&RequestDemand> = Vec::new();
        let mut allocated: BTreeMap<CardName, Cards> = BTreeMap::new();
        let mut all_allocated = true;
        let mut paid: Vec<String> = Vec::new();
        for c in claims {
            let claim = c
                .claim_name()
                .map(|n| ObjectKey::new(pod.namespace.clone(), n));
            let held = claim.as_ref().and_then(|k| match over {
                Some(e) if e.record.key == *k => Some(e),
                _ => self.claims.get(k),
            });
            let demand = match (held, &c.source) {
                (Some(e), _) => {
                    if matches!(c.source, ClaimSource::Claim(_))
                        && payer(&e.record).is_some_and(|p| p != pod.name)
                    {
                        continue;
                    }
                    match &e.allocated {
                        Some(Ok(models)) => {
                            for (_, m) in models {
                                *allocated.entry(m.clone()).or_default() += Cards::new(1);
                            }
                        }
                        // A device no slice held publishes: the cache lags the node's
                        // slice (R2), and the allocation reads as one not seen yet, so
                        // a bound pod counts on every model it may have got, never on
                        // none (it counted nothing, as a pod that cannot be charged).
                        Some(Err(DraError::UnknownDevice { .. })) | None => all_allocated = false,
                        Some(Err(err)) => return Err(err.clone()),
                    }
                    &e.demand
                }
                (None, ClaimSource::Template { template, .. }) => {
                    all_allocated = false;
                    let key = ObjectKey::new(pod.namespace.clone(), template.clone());
                    match self.templates.get(&key) {
                        Some(t) => &t.demand,
                        None => {
                            return Err(DraError::Missing {
                                pod: pod.to_string(),
                                claim: c.name.clone(),
                                object: format!("ResourceClaimTemplate {key}"),
                            })
                        }
                    }
                }
                (None, ClaimSource::Claim(name)) => {
                    return Err(DraError::Missing {
                        pod: pod.to_string(),
                        claim: c.name.clone(),
                        object: format!("ResourceClaim {}/{name}", pod.namespace),
                    })
                }
            };
            let demand = demand.as_ref().map_err(Clone::clone)?;
            if !demand.requests.is_empty() {
                if let Some(n) = c.claim_name() {
                    paid.push(n.to_string());
                }
            }
            requests.extend(&demand.requests);
        }
        let Some(first) = requests.first() else {
            return Ok(None);
        };
        let models: Vec<CardName> = first
            .models
            .models()
            .iter()
            .filter(|m| requests.iter().all(|r| r.models.contains(m)))
            .cloned()
            .collect();
        let Some(models) = Alternatives::from_models(models) else {
            let each: Vec<String> = requests.iter().map(|r| r.models.to_string()).collect();
            return Err(DraError::NoCommonModel {
                pod: pod.to_string(),
                models: each.join("; "),
            });
        };
        // A request's count on a model it may get: its largest way there (every model of
        // its alternatives has one).
        let on = |r: &RequestDemand, m: &CardName| r.per_model.get(m).copied().unwrap_or(r.count);
        let per_model: BTreeMap<CardName, Cards> = models
            .models()
            .iter()
            .map(|m| (m.clone(), requests.iter().map(|r| on(r, m)).sum()))
            .collect();
        Ok(Some(ClaimCards {
            resource: claim_resource(&first.class),
            cards: per_model.values().copied().max().unwrap_or_default(),
            per_model,
            models,
            allocated: all_allocated.then(|| allocated.into_iter().collect()),
            claims: paid,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cards::dra::claims::{claim_spec, device_class};
    use crate::cards::dra::devices::slice_devices;
    use serde_json::json;

    /// h200-1: two H200s; rtx-1: one RTX 4090; the NVIDIA gpu class.
    fn objects() -> DraObjects {
        let mut o = DraObjects::default();
        let gpu = |name: &str, product: &str| json!({"name": name, "attributes": {"type": {"string": "gpu"}, "productName": {"string": product}}});
        for (node, devs) in [
            (
                "h200-1",
                json!([gpu("gpu-0", "NVIDIA H200"), gpu("gpu-1", "NVIDIA H200")]),
            ),
            ("rtx-1", json!([gpu("gpu-0", "NVIDIA GeForce RTX 4090")])),
        ] {
            let s = json!({"metadata": {"name": node}, "spec": {"driver": "gpu.nvidia.com",
                "nodeName": node, "pool": {"name": node}, "devices": devs}});
            o.upsert_slice(node.into(), slice_devices(&s, &o.settings).unwrap(), None);
        }
        o.upsert_class(
            device_class(
                &json!({"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [
                {"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}),
            )
            .unwrap(),
            None,
        );
        o
    }

    /// The first pod a claim is reserved for pays (none of them is bound).
    fn none(c: &ClaimRecord) -> Option<String> {
        c.reserved_for.first().map(|r| r.name.clone())
    }

    fn spec(requests: serde_json::Value) -> Result<ClaimSpec, DraError> {
        claim_spec(&json!({"devices": {"requests": requests}}), "test")
    }

    fn template(o: &mut DraObjects, name: &str, requests: serde_json::Value) {
        o.upsert_template(ObjectKey::new("ml", name), spec(requests), None);
    }

    fn from_template(name: &str, template: &str) -> PodClaim {
        PodClaim {
            name: name.into(),
            source: ClaimSource::Template {
                template: template.into(),
                made: None,
            },
        }
    }

    fn shared(name: &str, claim: &str) -> PodClaim {
        PodClaim {
            name: name.into(),
            source: ClaimSource::Claim(claim.into()),
        }
    }

    fn h200(expr_count: u64) -> serde_json::Value {
        json!({"deviceClassName": "gpu.nvidia.com", "count": expr_count, "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]})
    }

    #[test]
    fn a_pods_claims_add_up_on_the_models_all_of_them_allow() {
        let mut o = objects();
        template(
            &mut o,
            "any",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
        );
        template(
            &mut o,
            "two-h200",
            json!([{"name": "g", "exactly": h200(2)}]),
        );
        template(
            &mut o,
            "rtx",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA GeForce')"}}]}}]),
        );
        let pod = ObjectKey::new("ml", "p");
        let c = o
            .pod_cards(
                &pod,
                &[from_template("a", "any"), from_template("b", "two-h200")],
                none,
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.cards.get(), c.models.to_string(), c.resource.as_str()),
            (
                3,
                "NVIDIA-H200".to_string(),
                "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
            )
        );
        assert_eq!(c.allocated, None);
        assert_eq!(
            o.pod_cards(&pod, &[from_template("a", "two-h200"), from_template("b", "rtx")], none)
                .unwrap_err()
                .to_string(),
            "pod ml/p: its claims' card requests share no model (NVIDIA-H200; NVIDIA-GeForce-RTX-4090); a pod runs on one card model"
        );
    }

    #[test]
    fn first_available_counts_its_largest_way_on_each_model() {
        let mut o = objects();
        template(
            &mut o,
            "fa",
            json!([{"name": "g", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": h200(2)["selectors"]},
            {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]),
        );
        let c = o
            .pod_cards(
                &ObjectKey::new("ml", "p"),
                &[from_template("g", "fa")],
                none,
            )
            .unwrap()
            .unwrap();
        assert_eq!(c.cards.get(), 2);
        assert_eq!(c.models.to_string(), "NVIDIA-H200|NVIDIA-GeForce-RTX-4090");
        // The two-H200 way cannot get an RTX 4090: one card there.
        let on = |models: &str| {
            c.cards_on(Some(&Alternatives::parse(models).unwrap()))
                .get()
        };
        assert_eq!(on("NVIDIA-GeForce-RTX-4090"), 1);
        assert_eq!(on("NVIDIA-H200"), 2);
        assert_eq!(on("NVIDIA-GeForce-RTX-4090|NVIDIA-H200"), 2);
        assert_eq!(c.cards_on(None).get(), 2);
    }

    #[test]
    fn a_shared_claim_is_paid_once_by_the_first_pod_it_is_reserved_for() {
        let mut o = objects();
        let claim = |reserved: serde_json::Value| {
            ClaimRecord::parse(&json!({"metadata": {"name": "s", "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
                "status": {"allocation": {"devices": {"results": [{"request": "g", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-1"}]}},
                    "reservedFor": reserved}}))
            .unwrap()
        };
        o.upsert_claim(claim(json!([{"resource": "pods", "name": "p1", "uid": "1"}, {"resource": "pods", "name": "p2", "uid": "2"}])), None);
        let cards = |pod: &str| {
            o.pod_cards(&ObjectKey::new("ml", pod), &[shared("g", "s")], none)
                .unwrap()
                .map(|c| (c.cards.get(), c.allocated))
        };
        let h200 = CardName::parse("NVIDIA-H200").unwrap();
        assert_eq!(
            cards("p1"),
            Some((1, Some(vec![(h200.clone(), Cards::new(1))])))
        );
        assert_eq!(cards("p2"), None);
        // p1 gone from it: p2 pays.
        o.upsert_claim(
            claim(json!([{"resource": "pods", "name": "p2", "uid": "2"}])),
            None,
        );
        let c = o
            .pod_cards(&ObjectKey::new("ml", "p2"), &[shared("g", "s")], none)
            .unwrap()
            .unwrap();
        assert_eq!(c.allocated, Some(vec![(h200, Cards::new(1))]));
    }

    #[test]
    fn a_new_device_class_selector_reads_every_demand_again() {
        let mut o = objects();
        template(
            &mut o,
            "any",
            json!([{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
        );
        let models = |o: &DraObjects| {
            o.pod_cards(
                &ObjectKey::new("ml", "p"),
                &[from_template("g", "any")],
                none,
            )
            .unwrap()
            .unwrap()
            .models
            .to_string()
        };
        assert_eq!(models(&o), "NVIDIA-GeForce-RTX-4090|NVIDIA-H200");
        o.upsert_class(
            device_class(&json!({"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}))
            .unwrap(),
            None,
        );
        assert_eq!(models(&o), "NVIDIA-H200");
    }
}
