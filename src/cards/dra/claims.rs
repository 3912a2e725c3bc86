//! A ResourceClaim's card demand: which models each of its card requests may get (the
//! devices its DeviceClass and selectors allow, in the order the request prefers them)
//! and how many; and, once the scheduler has allocated it, the models it got.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::devices::{Device, DeviceId};
use super::selectors::{Match, Selector};
use super::settings::DraSettings;
use super::DraError;
use crate::cards::names::{Alternatives, CardName, ObjectKey};
use crate::cards::quantity::Cards;

/// A DeviceClass: its name and the selectors every device of it must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceClass {
    pub name: String,
    pub selectors: Vec<Selector>,
    /// `spec.extendedResourceName` (Kubernetes 1.37): a pod asking for this extended
    /// resource may be served with this class's devices on a node whose allocatable
    /// does not list it.
    pub extended_resource: Option<String>,
}

impl DeviceClass {
    /// True when `device` is a card driver's and this class's selectors may match it.
    pub fn may_select_a_card(&self, device: &Device) -> bool {
        device.model.is_some()
            && self
                .selectors
                .iter()
                .all(|s| s.matches(device) != Match::No)
    }
}

/// Parses a `resource.k8s.io/v1` DeviceClass.
pub fn device_class(v: &Value) -> Result<DeviceClass, DraError> {
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let source = format!("DeviceClass {name}");
    let selectors = selectors(v.pointer("/spec/selectors"), &source, "spec.selectors")?;
    let extended_resource = match v.pointer("/spec/extendedResourceName") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if !r.is_empty() => Some(r.clone()),
        Some(_) => {
            return Err(DraError::Claim {
                object: source,
                field: "spec.extendedResourceName".into(),
                expected: "an extended resource name".into(),
            })
        }
    };
    Ok(DeviceClass {
        name,
        selectors,
        extended_resource,
    })
}

/// How many devices a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Exact(u64),
    /// `allocationMode: All`: every matching device on the node.
    All,
}

/// One way to satisfy a request: `exactly`, or one entry of `firstAvailable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subrequest {
    pub name: String,
    pub class: String,
    pub selectors: Vec<Selector>,
    pub count: Count,
}

/// A request of a claim, with its ways to be satisfied in the order it prefers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    pub name: String,
    pub options: Vec<Subrequest>,
}

/// What a ResourceClaim (or a ResourceClaimTemplate's claim) asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimSpec {
    pub requests: Vec<DeviceRequest>,
}

impl ClaimSpec {
    /// Every way of every request.
    pub fn options(&self) -> impl Iterator<Item = &Subrequest> {
        self.requests.iter().flat_map(|r| &r.options)
    }
}

/// True when a request (`exactly`) or an allocation result has admin access
/// (`adminAccess: true`, which the API server allows only in namespaces an admin labelled
/// for it): it reads devices other claims hold and takes none from them, so it asks for
/// no cards and is given none (a monitoring agent).
pub fn admin_access(v: &Value) -> bool {
    v.get("adminAccess").and_then(Value::as_bool) == Some(true)
}

/// Parses a ResourceClaim's `spec` (a template's `spec.spec`); `object` names the
/// object in errors (`ResourceClaim ml/c1`).
pub fn claim_spec(spec: &Value, object: &str) -> Result<ClaimSpec, DraError> {
    let bad = |field: String, expected: &str| DraError::Claim {
        object: object.to_string(),
        field,
        expected: expected.to_string(),
    };
    let requests = match spec.pointer("/devices/requests") {
        None | Some(Value::Null) => return Ok(ClaimSpec::default()),
        Some(Value::Array(r)) => r,
        Some(_) => return Err(bad("spec.devices.requests".into(), "a list")),
    };
    let mut out = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let at = format!("spec.devices.requests[{i}]");
        if r.get("exactly").is_some_and(admin_access) {
            continue;
        }
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.name"), "a request name"))?
            .to_string();
        let options = match (r.get("exactly"), r.get("firstAvailable")) {
            (Some(e), None) => vec![subrequest(e, &name, object, &format!("{at}.exactly"))?],
            (None, Some(Value::Array(subs))) if !subs.is_empty() => subs
                .iter()
                .enumerate()
                .map(|(j, s)| {
                    let field = format!("{at}.firstAvailable[{j}]");
                    let sub = s
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{field}.name"), "a subrequest name"))?;
                    subrequest(s, &format!("{name}/{sub}"), object, &field)
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(bad(
                    at,
                    "exactly one of exactly and firstAvailable (a non-empty list)",
                ))
            }
        };
        out.push(DeviceRequest { name, options });
    }
    Ok(ClaimSpec { requests: out })
}

fn subrequest(v: &Value, name: &str, object: &str, at: &str) -> Result<Subrequest, DraError> {
    let bad = |field: String, expected: &str| DraError::Claim {
        object: object.to_string(),
        field,
        expected: expected.to_string(),
    };
    let class = v
        .get("deviceClassName")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{at}.deviceClassName"), "a DeviceClass name"))?
        .to_string();
    let count = match v.get("allocationMode").and_then(Value::as_str) {
        None | Some("ExactCount") => match v.get("count") {
            None | Some(Value::Null) => Count::Exact(1),
            Some(c) => Count::Exact(
                c.as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("{at}.count"), "a positive whole number"))?,
            ),
        },
        Some("All") => Count::All,
        Some(_) => return Err(bad(format!("{at}.allocationMode"), "ExactCount or All")),
    };
    let source = format!("{object} request {name}");
    let selectors = selectors(v.get("selectors"), &source, &format!("{at}.selectors"))?;
    Ok(Subrequest {
        name: name.to_string(),
        class,
        selectors,
        count,
    })
}

fn selectors(v: Option<&Value>, source: &str, at: &str) -> Result<Vec<Selector>, DraError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(l)) => l,
        Some(_) => {
            return Err(DraError::Claim {
                object: source.to_string(),
                field: at.to_string(),
                expected: "a list".into(),
            })
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let expr = s
                .pointer("/cel/expression")
                .and_then(Value::as_str)
                .ok_or_else(|| DraError::Claim {
                    object: source.to_string(),
                    field: format!("{at}[{i}].cel.expression"),
                    expected: "a CEL expression".into(),
                })?;
            Selector::compile(expr, source)
        })
        .collect()
}

/// The card demand of one request: the models it may get, preferred first, and how
/// many cards on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestDemand {
    pub request: String,
    /// The DeviceClass of its first card way.
    pub class: String,
    pub models: Alternatives,
    /// The most any way takes (on any model).
    pub count: Cards,
    /// Per model: the most a way that may get that model takes. A `firstAvailable`
    /// request may fall back to a smaller way on a model, never to a larger one than
    /// its largest way there.
    pub per_model: BTreeMap<CardName, Cards>,
}

/// The card demand of a claim: one entry per request of a card class (`card`: see
/// [`super::pods::DraObjects::is_card_class`]).
/// A request whose every way is of another class asks for no card. `models_of` gives
/// the models a way of a card class may get, sorted
/// ([`super::matches::matching_models`] against the devices published, or what
/// [`super::matches::Matches`] keeps of it).
pub fn claim_demand(
    spec: &ClaimSpec,
    object: &str,
    card: &BTreeSet<String>,
    mut models_of: impl FnMut(&Subrequest) -> Vec<CardName>,
) -> Result<Vec<RequestDemand>, DraError> {
    let card_classes = card;
    let mut out = Vec::new();
    for r in &spec.requests {
        let card: Vec<&Subrequest> = r
            .options
            .iter()
            .filter(|o| card_classes.contains(&o.class))
            .collect();
        let Some(class) = card.first().map(|o| o.class.clone()) else {
            continue;
        };
        let mut models: Vec<CardName> = Vec::new();
        let mut count = 0u64;
        let mut per_model: BTreeMap<CardName, Cards> = BTreeMap::new();
        for o in card {
            let n = match o.count {
                Count::Exact(n) => n,
                Count::All => {
                    return Err(DraError::AllDevices {
                        object: object.to_string(),
                        request: o.name.clone(),
                        class: o.class.clone(),
                    })
                }
            };
            count = count.max(n);
            for m in models_of(o) {
                let most = per_model.entry(m.clone()).or_default();
                *most = (*most).max(Cards::new(n));
                if !models.contains(&m) {
                    models.push(m);
                }
            }
        }
        let Some(models) = Alternatives::from_models(models) else {
            return Err(DraError::NoDevice {
                object: object.to_string(),
                request: r.name.clone(),
                classes: r
                    .options
                    .iter()
                    .map(|o| o.class.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        out.push(RequestDemand {
            request: r.name.clone(),
            class,
            models,
            count: Cards::new(count),
            per_model,
        });
    }
    Ok(out)
}

/// One device a claim's allocation gives it (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    pub request: String,
    pub device: DeviceId,
    /// Given with admin access (`adminAccess: true`): the device stays another claim's,
    /// and is no card of this one.
    pub admin_access: bool,
}

/// A ResourceClaim as card-quota reads it: what it asks for, what it got and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    pub key: ObjectKey,
    pub spec: Result<ClaimSpec, DraError>,
    /// `None` while unallocated.
    pub allocation: Option<Result<Vec<Allocated>, DraError>>,
    /// The pods `status.reservedFor` names, in its order: the first pays for a shared claim.
    pub reserved_for: Vec<Reservation>,
    /// Made by kube-scheduler for a pod's DRA-backed extended resources (annotation
    /// `resource.kubernetes.io/extended-resource-claim: "true"`): its cards are the pod's
    /// extended-resource cards, never counted on their own.
    pub for_extended_resources: bool,
    /// `metadata.resourceVersion`: how far the claims' stream had come when this was
    /// read (a ledger entry its allocation shows is pruned at it).
    pub resource_version: Option<u64>,
}

/// A pod a claim is reserved for (`status.reservedFor`): by name, and by uid when the
/// entry carries one (the API server requires it), so a pod deleted and created again
/// under that name is not taken for the one the claim was reserved for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub name: String,
    pub uid: Option<String>,
}

impl Reservation {
    /// True when a pod of this name with `uid` (unknown: any) is the one reserved for.
    pub fn is(&self, uid: Option<&str>) -> bool {
        match (self.uid.as_deref(), uid) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        }
    }
}

/// The annotation kube-scheduler puts on the claim it makes for a pod's DRA-backed
/// extended resources.
pub const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";

impl ClaimRecord {
    /// True when `other` reads the same to card-quota, whatever its resourceVersion.
    pub fn reads_as(&self, other: &ClaimRecord) -> bool {
        self.key == other.key
            && self.spec == other.spec
            && self.allocation == other.allocation
            && self.reserved_for == other.reserved_for
            && self.for_extended_resources == other.for_extended_resources
    }

    /// Reads a `resource.k8s.io/v1` ResourceClaim.
    pub fn parse(v: &Value) -> Result<Self, DraError> {
        let meta = |f: &str| {
            v.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let key = ObjectKey::new(meta("namespace"), meta("name"));
        if key.name.is_empty() {
            return Err(DraError::Claim {
                object: "ResourceClaim".into(),
                field: "metadata.name".into(),
                expected: "a name".into(),
            });
        }
        let object = format!("ResourceClaim {key}");
        let spec = claim_spec(v.get("spec").unwrap_or(&Value::Null), &object);
        let allocation = allocation(v, &object).transpose();
        Ok(Self {
            key,
            spec,
            allocation,
            reserved_for: reserved_for(v),
            for_extended_resources: v
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM))
                .and_then(Value::as_str)
                == Some("true"),
            resource_version: v
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|rv| rv.parse().ok()),
        })
    }
}

/// The pods a ResourceClaim's `status.reservedFor` names, in its order.
pub fn reserved_for(claim: &Value) -> Vec<Reservation> {
    claim
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r.get("resource").and_then(Value::as_str) == Some("pods"))
        .filter_map(|r| {
            let name = r.get("name").and_then(Value::as_str)?.to_string();
            let uid = r.get("uid").and_then(Value::as_str).map(str::to_string);
            Some(Reservation { name, uid })
        })
        .collect()
}

/// The devices a claim's allocation (`status.allocation.devices.results`) gave it;
/// `None` while it is not allocated.
pub fn allocation(claim: &Value, object: &str) -> Result<Option<Vec<Allocated>>, DraError> {
    if claim
        .pointer("/status/allocation")
        .is_none_or(Value::is_null)
    {
        return Ok(None);
    }
    let results = match claim.pointer("/status/allocation/devices/results") {
        None | Some(Value::Null) => return Ok(Some(Vec::new())),
        Some(Value::Array(r)) => r,
        Some(_) => {
            return Err(DraError::Claim {
                object: object.to_string(),
                field: "status.allocation.devices.results".into(),
                expected: "a list".into(),
            })
        }
    };
    Ok(Some(
        results
            .iter()
            .map(|r| {
                let field = |f: &str| r.get(f).and_then(Value::as_str).unwrap_or("").to_string();
                Allocated {
                    admin_access: admin_access(r),
                    request: field("request"),
                    device: DeviceId {
                        driver: field("driver"),
                        pool: field("pool"),
                        name: field("device"),
                    },
                }
            })
            .collect(),
    ))
}

/// The card models an allocation gave, one per allocated card device, with the
/// request each serves. A result naming a device of a card driver that no slice
/// publishes is an error: the caller fails closed.
pub fn allocated_models<'a>(
    results: &[Allocated],
    object: &str,
    settings: &DraSettings,
    find: impl Fn(&DeviceId) -> Option<&'a Device>,
) -> Result<Vec<(String, CardName)>, DraError> {
    let mut out = Vec::new();
    for (i, r) in results.iter().enumerate() {
        if r.admin_access || settings.driver(&r.device.driver).is_none() {
            continue;
        }
        let model = match find(&r.device).and_then(|d| d.model.clone()) {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(e),
            None => {
                return Err(DraError::UnknownDevice {
                    object: object.to_string(),
                    index: i,
                    device: r.device.to_string(),
                })
            }
        };
        out.push((r.request.clone(), model));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cards::dra::devices::slice_devices;

    fn devices() -> Vec<Device> {
        let s = |node: &str, devs: Value| {
            serde_json::json!({"metadata": {"name": node}, "spec": {"driver": "gpu.nvidia.com",
                "nodeName": node, "pool": {"name": node}, "devices": devs}})
        };
        let gpu = |name: &str, product: &str| serde_json::json!({"name": name, "attributes": {"type": {"string": "gpu"}, "productName": {"string": product}}});
        let mig = |name: &str, profile: &str| {
            serde_json::json!({"name": name, "attributes": {"type": {"string": "mig"},
                "productName": {"string": "NVIDIA H200"}, "profile": {"string": profile}}})
        };
        let settings = DraSettings::default();
        let mut out = slice_devices(
            &s(
                "h200-1",
                serde_json::json!([
                    gpu("gpu-0", "NVIDIA H200"),
                    gpu("gpu-1", "NVIDIA H200"),
                    mig("gpu-2-mig-0", "1g.18gb")
                ]),
            ),
            &settings,
        )
        .unwrap();
        out.extend(
            slice_devices(
                &s(
                    "rtx-1",
                    serde_json::json!([gpu("gpu-0", "NVIDIA GeForce RTX 4090")]),
                ),
                &settings,
            )
            .unwrap(),
        );
        out
    }

    fn classes() -> BTreeMap<String, DeviceClass> {
        let class = |name: &str, expr: &str| {
            device_class(&serde_json::json!({"metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}}))
            .unwrap()
        };
        [
            class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"),
            class("mig.nvidia.com", "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"),
            class("nic.example.com", "device.driver == 'nic.example.com'"),
        ]
        .into_iter()
        .map(|c| (c.name.clone(), c))
        .collect()
    }

    fn demand(spec: Value) -> Result<Vec<(String, String, u128)>, DraError> {
        let spec = claim_spec(&spec, "ResourceClaim ml/c")?;
        let classes = classes();
        let devices = devices();
        let card: BTreeSet<String> = classes
            .values()
            .filter(|c| devices.iter().any(|d| c.may_select_a_card(d)))
            .map(|c| c.name.clone())
            .collect();
        let models_of = |o: &Subrequest| {
            let class = classes.get(&o.class).map(|c| c.selectors.as_slice());
            crate::cards::dra::matches::matching_models(
                class.unwrap_or_default(),
                &o.selectors,
                devices.iter(),
            )
        };
        Ok(claim_demand(&spec, "ResourceClaim ml/c", &card, models_of)?
            .into_iter()
            .map(|d| (d.request, d.models.to_string(), d.count.get()))
            .collect())
    }

    #[test]
    fn a_request_may_get_the_models_its_class_and_selectors_allow() {
        let any_gpu = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}});
        assert_eq!(
            demand(any_gpu).unwrap(),
            [(
                "gpu".into(),
                "NVIDIA-GeForce-RTX-4090|NVIDIA-H200".into(),
                2
            )]
        );
        let h200 = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}]}});
        assert_eq!(
            demand(h200).unwrap(),
            [("gpu".into(), "NVIDIA-H200".into(), 1)]
        );
        let mig = serde_json::json!({"devices": {"requests": [{"name": "m", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}});
        assert_eq!(
            demand(mig).unwrap(),
            [("m".into(), "NVIDIA-H200/mig-1g.18gb-mixed".into(), 1)]
        );
    }

    #[test]
    fn first_available_keeps_its_order_and_other_classes_ask_for_no_card() {
        let spec = serde_json::json!({"devices": {"requests": [
            {"name": "gpu", "firstAvailable": [
                {"name": "h200", "deviceClassName": "gpu.nvidia.com", "count": 2, "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]},
                {"name": "rtx", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA GeForce')"}}]}]},
            {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}});
        // The preferred way first (not name order); the larger count of the two.
        assert_eq!(
            demand(spec).unwrap(),
            [(
                "gpu".into(),
                "NVIDIA-H200|NVIDIA-GeForce-RTX-4090".into(),
                2
            )]
        );
    }

    #[test]
    fn what_cannot_be_bounded_or_met_is_an_error_naming_the_request() {
        let all = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}});
        assert_eq!(
            demand(all).unwrap_err().to_string(),
            "ResourceClaim ml/c request gpu asks for every device of DeviceClass gpu.nvidia.com (allocationMode: All): card-quota cannot bound its cards; ask for a count"
        );
        let none = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}}]}}]}});
        assert_eq!(
            demand(none).unwrap_err().to_string(),
            "ResourceClaim ml/c request gpu: no published card device matches it (DeviceClass gpu.nvidia.com)"
        );
        let both = serde_json::json!({"devices": {"requests": [{"name": "gpu"}]}});
        assert_eq!(
            demand(both).unwrap_err().to_string(),
            "ResourceClaim ml/c: spec.devices.requests[0]: expected exactly one of exactly and firstAvailable (a non-empty list)"
        );
        let count = serde_json::json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}]}});
        assert_eq!(
            demand(count).unwrap_err().to_string(),
            "ResourceClaim ml/c: spec.devices.requests[0].exactly.count: expected a positive whole number"
        );
    }

    #[test]
    fn admin_access_asks_for_no_cards_and_is_given_none() {
        // Every device of the class, with admin access: no request, so no cards (and no
        // refusal of `allocationMode: All`); a request beside it still counts.
        let admin = serde_json::json!({"devices": {"requests": [
            {"name": "mon", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": true}},
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": false,
                "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]}}]}});
        assert_eq!(
            demand(admin).unwrap(),
            [("gpu".into(), "NVIDIA-H200".into(), 1)]
        );
        let devs = devices();
        let find = |id: &DeviceId| devs.iter().find(|d| &d.id == id);
        let claim = serde_json::json!({"status": {"allocation": {"devices": {"results": [
            {"request": "mon", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-0", "adminAccess": true},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-1", "adminAccess": false},
            {"request": "mon", "driver": "gpu.nvidia.com", "pool": "h200-9", "device": "gpu-0", "adminAccess": true}]}}}});
        let results = allocation(&claim, "ResourceClaim ml/c").unwrap().unwrap();
        assert_eq!(
            allocated_models(
                &results,
                "ResourceClaim ml/c",
                &DraSettings::default(),
                find
            )
            .unwrap(),
            [("gpu".to_string(), CardName::parse("NVIDIA-H200").unwrap())],
            "admin access gives no card, not even of a device no slice shows"
        );
    }

    #[test]
    fn an_allocation_gives_the_models_of_the_devices_it_names() {
        let devs = devices();
        let find = |id: &DeviceId| devs.iter().find(|d| &d.id == id);
        let claim = serde_json::json!({"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-1", "device": "gpu-1"},
            {"request": "nic", "driver": "nic.example.com", "pool": "p", "device": "nic-0"}]}}}});
        let results = |c: &Value| allocation(c, "ResourceClaim ml/c").unwrap().unwrap();
        let got = allocated_models(
            &results(&claim),
            "ResourceClaim ml/c",
            &DraSettings::default(),
            find,
        )
        .unwrap();
        assert_eq!(
            got,
            [("gpu".to_string(), CardName::parse("NVIDIA-H200").unwrap())]
        );
        let gone = serde_json::json!({"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h200-9", "device": "gpu-0"}]}}}});
        assert_eq!(
            allocated_models(
                &results(&gone),
                "ResourceClaim ml/c",
                &DraSettings::default(),
                find
            )
                .unwrap_err()
                .to_string(),
            "ResourceClaim ml/c: status.allocation.devices.results[0] names device gpu.nvidia.com/h200-9/gpu-0, which no ResourceSlice publishes"
        );
    }
}
