//! `card-quota manifests`: the install YAML of `manifests/` with the caBundle and the
//! serving-certificate Secret filled in, or (with `--url`) just the webhook
//! configurations for a webhook served outside the cluster (local runs, e2e).

use std::path::Path;

use base64::Engine;
use serde_json::{json, Value};

use crate::cards::dra::DraSettings;
use crate::snapshot::load::documents;

/// The kustomize resources, in `manifests/kustomization.yaml` order.
const FILES: [(&str, &str); 7] = [
    (
        "namespace.yaml",
        include_str!("../../manifests/base/namespace.yaml"),
    ),
    ("rbac.yaml", include_str!("../../manifests/base/rbac.yaml")),
    (
        "deployment.yaml",
        include_str!("../../manifests/base/deployment.yaml"),
    ),
    (
        "service.yaml",
        include_str!("../../manifests/base/service.yaml"),
    ),
    ("pdb.yaml", include_str!("../../manifests/base/pdb.yaml")),
    (
        "networkpolicy.yaml",
        include_str!("../../manifests/base/networkpolicy.yaml"),
    ),
    (
        "webhooks.yaml",
        include_str!("../../manifests/webhooks/webhooks.yaml"),
    ),
];

/// Why the install YAML could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("embedded manifest {file}: {message}")]
    Manifest { file: &'static str, message: String },
    #[error(transparent)]
    Certs(#[from] crate::webhook::certs::CertsError),
}

/// What to produce.
pub struct Options<'a> {
    pub cert_dir: &'a Path,
    /// Serve the webhooks from this base URL instead of the in-cluster Service.
    pub url: Option<&'a str>,
    /// Drop `matchConditions` (API servers before 1.30 reject them).
    pub without_match_conditions: bool,
    /// `serve --no-pin`: the binding check is the hard line, so the binding hooks fail
    /// closed (with pins on they are a safety net that fails open: DESIGN's blast radius).
    pub no_pin: bool,
    /// `serve --enforcement` of the Deployment.
    pub enforcement: crate::decide::Enforcement,
    /// `serve --namespace-enforcement` of the Deployment.
    pub namespace_enforcement: &'a crate::decide::NamespaceEnforcement,
    /// The Deployment's image (default: the release's, `ghcr.io/card-quota/card-quota:<version>`).
    pub image: Option<&'a str>,
    /// Name of the webhook configurations (default `card-quota`).
    pub name: Option<&'a str>,
    /// Only namespaces carrying this label (`key=value`) reach the webhooks.
    pub namespace_label: Option<(&'a str, &'a str)>,
    /// Who card-quota is and whom it gates.
    pub scope: Scope,
}

/// The install's identity and the workloads it gates, for clusters that differ from the
/// defaults (another namespace, another Volcano install, kube-scheduler only, ...).
#[derive(Debug, Clone)]
pub struct Scope {
    /// card-quota's namespace.
    pub namespace: String,
    /// card-quota's service account (its own writes skip the Queue hook).
    pub service_account: String,
    /// The card resources: the pod hooks select exactly the pods that request one, and
    /// `serve` counts exactly those (`--card-resource`).
    pub cards: crate::cards::CardResources,
    /// Users whose `pods/binding` requests are gated (the schedulers' identities).
    pub binders: Vec<String>,
}

impl Default for Scope {
    fn default() -> Self {
        Self {
            namespace: "card-quota".into(),
            service_account: "card-quota".into(),
            cards: crate::cards::CardResources::default(),
            binders: vec![
                "system:serviceaccount:volcano-system:volcano-scheduler".into(),
                "system:kube-scheduler".into(),
            ],
        }
    }
}

/// The hooks of pods whose only cards may come from ResourceClaims.
const CLAIM_PODS_HOOK: &str = "claim-pods.card-quota.volcano.sh";

/// A CEL string literal.
fn cel_string(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn cel_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| cel_string(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// The `claims-only` condition of the claim-pods hooks: ResourceClaims and no other card
/// demand (a condition cannot read a claim's DeviceClass, so a NIC's claim is sent too).
pub fn claims_only_condition(cards: &crate::cards::CardResources) -> String {
    format!(
        "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0 && !( {})",
        card_demand_condition(cards)
    )
}

/// The `card-drivers` condition of the allocation hook: a device of one of the card
/// drivers among the allocation's results, not given with admin access (such a device
/// stays the card of the claim that holds it: `cards::dra::claims::admin_access`), so
/// a monitoring agent's allocation does not wait for card-quota.
pub fn card_drivers_condition(dra: &DraSettings) -> String {
    let drivers: Vec<String> = dra.drivers().iter().map(|d| d.driver.clone()).collect();
    format!(
        "has(object.status) && has(object.status.allocation) && has(object.status.allocation.devices) && has(object.status.allocation.devices.results) && object.status.allocation.devices.results.exists(r, r.driver in {} && !(has(r.adminAccess) && r.adminAccess))",
        cel_list(&drivers)
    )
}

/// The `card-demand` condition of the pod hooks: a `card.name`, or a request or limit
/// other than 0 of one of `cards` in any container or init container.
pub fn card_demand_condition(cards: &crate::cards::CardResources) -> String {
    let names: Vec<String> = cards.names().map(str::to_string).collect();
    let prefixes: Vec<String> = cards.prefixes().map(str::to_string).collect();
    let r = format!(
        "(r in {} || {}.exists(p, r.startsWith(p)))",
        cel_list(&names),
        cel_list(&prefixes)
    );
    // A card resource asked for as 0 (a chart's CPU variant) is no card demand: such a
    // pod is cardless to card-quota and must not wait for it either.
    let asks = |list: &str| {
        format!(
            "{list}.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, {r} && c.resources.limits[r] != '0')) || (has(c.resources.requests) && c.resources.requests.exists(r, {r} && c.resources.requests[r] != '0'))))"
        )
    };
    format!(
        "(has(object.metadata.annotations) && 'volcano.sh/card.name' in object.metadata.annotations) || {} || (has(object.spec.initContainers) && {})",
        asks("object.spec.containers"),
        asks("object.spec.initContainers")
    )
}

/// Puts `scope` into the objects: namespace, service account, and the match conditions
/// naming card resources, binders and card-quota itself.
fn apply_scope(objects: &mut [Value], scope: &Scope) {
    const NS: &str = "card-quota";
    let ns = json!(scope.namespace);
    for o in objects.iter_mut() {
        if o["metadata"]["namespace"] == NS {
            o["metadata"]["namespace"] = ns.clone();
        }
        match o["kind"].as_str().unwrap_or_default() {
            "Namespace" if o["metadata"]["name"] == NS => o["metadata"]["name"] = ns.clone(),
            "ServiceAccount" => o["metadata"]["name"] = json!(scope.service_account),
            "Deployment" => {
                let spec = &mut o["spec"]["template"]["spec"];
                spec["serviceAccountName"] = json!(scope.service_account);
                // `serve` counts exactly the card resources the hooks select.
                if let Some(args) = spec
                    .pointer_mut("/containers/0/args")
                    .and_then(Value::as_array_mut)
                {
                    args.retain(|a| {
                        !a.as_str().is_some_and(|a| {
                            ["--card-resource=", "--dra-driver=", "--dra-class="]
                                .iter()
                                .any(|f| a.starts_with(f))
                        })
                    });
                    if !scope.cards.is_default() {
                        args.extend(
                            scope
                                .cards
                                .patterns()
                                .iter()
                                .map(|p| json!(format!("--card-resource={p}"))),
                        );
                    }
                    let (dra, defaults) = (scope.cards.dra(), DraSettings::default());
                    if dra.drivers() != defaults.drivers() {
                        args.extend(
                            dra.drivers()
                                .iter()
                                .map(|d| json!(format!("--dra-driver={}", d.setting()))),
                        );
                    }
                    if !dra.classes().eq(defaults.classes()) {
                        args.extend(dra.classes().map(|c| json!(format!("--dra-class={c}"))));
                    }
                }
            }
            "ClusterRoleBinding" | "RoleBinding" => {
                for sub in o["subjects"].as_array_mut().into_iter().flatten() {
                    sub["namespace"] = ns.clone();
                    sub["name"] = json!(scope.service_account);
                }
            }
            _ => {}
        }
        for hook in o
            .get_mut("webhooks")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(svc) = hook.pointer_mut("/clientConfig/service") {
                svc["namespace"] = ns.clone();
            }
            for e in hook
                .pointer_mut("/namespaceSelector/matchExpressions")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                for v in e["values"].as_array_mut().into_iter().flatten() {
                    if v == NS {
                        *v = ns.clone();
                    }
                }
            }
            for c in hook
                .get_mut("matchConditions")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let expr = match c["name"].as_str().unwrap_or_default() {
                    "card-demand" => card_demand_condition(&scope.cards),
                    "claims-only" => claims_only_condition(&scope.cards),
                    "card-drivers" => card_drivers_condition(scope.cards.dra()),
                    "gated-binders" => {
                        format!("request.userInfo.username in {}", cel_list(&scope.binders))
                    }
                    "not-card-quota-itself" => format!(
                        "request.userInfo.username != {}",
                        cel_string(&format!(
                            "system:serviceaccount:{}:{}",
                            scope.namespace, scope.service_account
                        ))
                    ),
                    _ => continue,
                };
                c["expression"] = json!(expr);
            }
        }
    }
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, ManifestError> {
    let path = dir.join(name);
    std::fs::read(&path).map_err(|source| ManifestError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn is_webhook_config(v: &Value) -> bool {
    matches!(
        v.get("kind").and_then(Value::as_str),
        Some("MutatingWebhookConfiguration") | Some("ValidatingWebhookConfiguration")
    )
}

/// A webhook on `pods/binding`.
fn is_binding_hook(hook: &Value) -> bool {
    hook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["resources"].as_array().into_iter().flatten())
        .any(|r| r == "pods/binding")
}

/// The install objects as a YAML stream.
pub fn render(opts: &Options) -> Result<String, ManifestError> {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let ca = b64(crate::webhook::certs::ca_bundle(opts.cert_dir)?.as_bytes());
    if opts.url.is_none() {
        crate::webhook::certs::check_service(opts.cert_dir, "card-quota", &opts.scope.namespace)?;
    }
    let mut objects = Vec::new();
    for (file, text) in FILES {
        let docs = documents(text).map_err(|e| ManifestError::Manifest {
            file,
            message: e.to_string(),
        })?;
        objects.extend(docs);
    }
    apply_scope(&mut objects, &opts.scope);
    let mut serve_args = Vec::new();
    if opts.no_pin {
        serve_args.push(json!("--no-pin"));
    }
    if opts.enforcement != crate::decide::Enforcement::Deny {
        serve_args.push(json!(format!(
            "--enforcement={}",
            opts.enforcement.as_str()
        )));
    }
    for (ns, mode) in opts.namespace_enforcement.entries() {
        serve_args.push(json!(format!(
            "--namespace-enforcement={ns}={}",
            mode.as_str()
        )));
    }
    for o in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
        if let Some(image) = opts.image {
            o["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
        }
        if let Some(args) = o
            .pointer_mut("/spec/template/spec/containers/0/args")
            .and_then(Value::as_array_mut)
        {
            args.extend(serve_args.iter().cloned());
        }
    }
    if opts.url.is_some() {
        objects.retain(is_webhook_config);
    }
    for o in objects.iter_mut().filter(|o| is_webhook_config(o)) {
        if opts.without_match_conditions {
            // Without conditions the pod hooks see every pod, claim pods included: the
            // claim-pods hooks would decide each pod a second time.
            if let Some(hooks) = o.get_mut("webhooks").and_then(Value::as_array_mut) {
                hooks.retain(|h| h["name"] != CLAIM_PODS_HOOK);
            }
        }
        for hook in o
            .get_mut("webhooks")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let path = hook
                .pointer("/clientConfig/service/path")
                .and_then(Value::as_str)
                .unwrap_or("/validate")
                .to_string();
            hook["clientConfig"] = match opts.url {
                Some(base) => {
                    json!({"url": format!("{}{path}", base.trim_end_matches('/')), "caBundle": ca})
                }
                None => {
                    let mut c = hook["clientConfig"].clone();
                    c["caBundle"] = json!(ca);
                    c
                }
            };
            if opts.without_match_conditions {
                if let Some(m) = hook.as_object_mut() {
                    m.remove("matchConditions");
                }
            }
            if opts.no_pin && is_binding_hook(hook) {
                hook["failurePolicy"] = json!("Fail");
            }
            // Warn never holds work back: not even while card-quota is down. The Queue
            // hook is an admin's write, not work: a malformed quota is still refused.
            if opts.enforcement == crate::decide::Enforcement::Warn
                && hook["name"] != "queues.card-quota.volcano.sh"
            {
                hook["failurePolicy"] = json!("Ignore");
            }
            if let (Some((k, v)), Some(sel)) = (
                opts.namespace_label,
                hook.get_mut("namespaceSelector")
                    .and_then(Value::as_object_mut),
            ) {
                sel.insert("matchLabels".into(), json!({ k: v }));
            }
        }
        if let Some(name) = opts.name {
            o["metadata"]["name"] = json!(name);
        }
    }
    if opts.url.is_none() {
        objects.push(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "card-quota-tls", "namespace": opts.scope.namespace},
            "data": {
                "tls.crt": b64(&read(opts.cert_dir, "tls.crt")?),
                "tls.key": b64(&read(opts.cert_dir, "tls.key")?),
            }
        }));
    }
    // Every object says what installed it: `kubectl delete ... -l
    // app.kubernetes.io/name=card-quota` finds them all.
    for o in objects.iter_mut() {
        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("app.kubernetes.io/name".into(), json!("card-quota"));
                l.insert(
                    "app.kubernetes.io/managed-by".into(),
                    json!("card-quota-manifests"),
                );
            }
        }
    }
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(
            &serde_norway::to_string(&o).map_err(|e| ManifestError::Manifest {
                file: "output",
                message: e.to_string(),
            })?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certs() -> tempdir::Dir {
        tempdir::Dir::new()
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!(
                    "card-quota-manifests-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    /// DESIGN 6a: with pins on, the binding hooks fail open (a binding cannot show whether
    /// its pod has cards); `--no-pin` makes them the hard line again.
    #[test]
    fn binding_hooks_fail_open_with_pins_and_closed_without() {
        let d = certs();
        crate::webhook::tls::generate("card-quota", "card-quota", &[], &[], &d.0).unwrap();
        for no_pin in [false, true] {
            let text = render(&Options {
                cert_dir: &d.0,
                url: None,
                without_match_conditions: false,
                no_pin,
                enforcement: crate::decide::Enforcement::Deny,
                namespace_enforcement: &Default::default(),
                image: None,
                name: None,
                namespace_label: None,
                scope: Scope::default(),
            })
            .unwrap();
            let docs = documents(&text).unwrap();
            let hooks: Vec<&Value> = docs
                .iter()
                .filter(|o| is_webhook_config(o))
                .flat_map(|o| o["webhooks"].as_array().unwrap())
                .collect();
            let binding: Vec<&str> = hooks
                .iter()
                .filter(|h| is_binding_hook(h))
                .map(|h| h["failurePolicy"].as_str().unwrap())
                .collect();
            let want = if no_pin { "Fail" } else { "Ignore" };
            assert_eq!(binding, [want, want], "no_pin {no_pin}");
            // Pod hooks stay fail-closed either way: they see the pod's card demand.
            assert!(hooks
                .iter()
                .filter(|h| h["name"] == "pods.card-quota.volcano.sh")
                .all(|h| h["failurePolicy"] == "Fail"));
            let args = docs
                .iter()
                .find(|o| o["kind"] == "Deployment")
                .and_then(|o| o.pointer("/spec/template/spec/containers/0/args"))
                .and_then(Value::as_array)
                .unwrap();
            assert_eq!(args.iter().any(|a| a == "--no-pin"), no_pin);
        }
    }

    #[test]
    fn image_and_enforcement_reach_the_deployment_and_foreign_certificates_are_refused() {
        let d = certs();
        crate::webhook::tls::generate("card-quota", "card-quota", &[], &[], &d.0).unwrap();
        let ml_deny = crate::decide::NamespaceEnforcement::parse(&["ml=deny"]).unwrap();
        let opts = |namespace: &str| Options {
            cert_dir: &d.0,
            url: None,
            without_match_conditions: false,
            no_pin: false,
            enforcement: crate::decide::Enforcement::Warn,
            namespace_enforcement: &ml_deny,
            image: Some("registry.example/cq:dev"),
            name: None,
            namespace_label: None,
            scope: Scope {
                namespace: namespace.into(),
                ..Scope::default()
            },
        };
        let docs = documents(&render(&opts("card-quota")).unwrap()).unwrap();
        let c = docs
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .and_then(|o| o.pointer("/spec/template/spec/containers/0"))
            .unwrap();
        assert_eq!(c["image"], "registry.example/cq:dev");
        // Every object is labelled for cleanup.
        for d in &docs {
            assert_eq!(
                d["metadata"]["labels"]["app.kubernetes.io/name"], "card-quota",
                "{d}"
            );
        }
        assert!(c["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--enforcement=warn"));
        assert!(c["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--namespace-enforcement=ml=deny"));
        // A warn install never holds work back, not even while card-quota is down; only
        // the Queue hook (an admin's write) still fails closed.
        let closed: Vec<&Value> = docs
            .iter()
            .filter(|o| is_webhook_config(o))
            .flat_map(|o| o["webhooks"].as_array().unwrap())
            .filter(|h| h["failurePolicy"] != "Ignore")
            .map(|h| &h["name"])
            .collect();
        assert_eq!(closed, ["queues.card-quota.volcano.sh"]);
        let e = render(&opts("gpu")).unwrap_err().to_string();
        assert!(
            e.ends_with("is for card-quota.card-quota.svc, not card-quota.gpu.svc: make certificates for this namespace with `card-quota certs --namespace gpu`"),
            "{e}"
        );
    }

    #[test]
    fn every_webhook_gets_the_ca_and_the_secret_holds_the_serving_pair() {
        let d = certs();
        crate::webhook::tls::generate("card-quota", "card-quota", &[], &[], &d.0).unwrap();
        let text = render(&Options {
            cert_dir: &d.0,
            url: None,
            without_match_conditions: false,
            no_pin: false,
            enforcement: crate::decide::Enforcement::Deny,
            namespace_enforcement: &Default::default(),
            image: None,
            name: None,
            namespace_label: None,
            scope: Scope::default(),
        })
        .unwrap();
        let docs = documents(&text).unwrap();
        let ca = base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(d.0.join("ca.crt")).unwrap());
        let hooks: Vec<&Value> = docs
            .iter()
            .filter(|o| is_webhook_config(o))
            .flat_map(|o| o["webhooks"].as_array().unwrap())
            .collect();
        assert_eq!(hooks.len(), 16);
        for h in &hooks {
            assert_eq!(h["clientConfig"]["caBundle"], json!(ca), "{h}");
            assert_eq!(h["clientConfig"]["service"]["name"], "card-quota");
        }
        assert!(!text.contains("Q0FfQlVORExF"), "placeholder left in");
        let secret = docs.iter().find(|o| o["kind"] == "Secret").unwrap();
        assert_eq!(secret["type"], "kubernetes.io/tls");
        assert!(secret["data"]["tls.key"].as_str().unwrap().len() > 100);
    }

    /// The YAML's conditions named `name`, whitespace squashed.
    fn yaml_conditions(name: &str) -> Vec<String> {
        let text = include_str!("../../manifests/webhooks/webhooks.yaml");
        documents(text)
            .unwrap()
            .iter()
            .flat_map(|o| o["webhooks"].as_array().cloned().unwrap_or_default())
            .flat_map(|h| h["matchConditions"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["name"] == name)
            .map(|c| squash(c["expression"].as_str().unwrap_or_default()))
            .collect()
    }

    fn squash(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The YAML's card conditions (kustomize, the chart's files) are the ones `manifests`
    /// renders for the default card settings.
    #[test]
    fn the_pod_hooks_select_the_default_card_resources() {
        let cards = crate::cards::CardResources::default();
        let demand = squash(&card_demand_condition(&cards));
        assert_eq!(
            yaml_conditions("card-demand"),
            vec![demand.clone(), demand],
            "both pod hooks"
        );
        // The claim-pods hooks take the pods with claims the pod hooks leave.
        let claims = squash(&claims_only_condition(&cards));
        assert_eq!(yaml_conditions("claims-only"), vec![claims.clone(), claims]);
        // The allocation hook names the default card drivers.
        assert_eq!(
            yaml_conditions("card-drivers"),
            vec![squash(&card_drivers_condition(&DraSettings::default()))]
        );
        let text = include_str!("../../manifests/webhooks/webhooks.yaml");
        assert!(
            !text.contains("schedulerName"),
            "no hook filters by scheduler"
        );
    }

    /// The pod hooks' condition, evaluated as the API server would (CEL over the pod):
    /// a card resource asked for as 0 is no card demand (issue 57 #7).
    #[test]
    fn the_card_demand_condition_selects_card_pods_and_not_zero_requests() {
        let cond = card_demand_condition(&crate::cards::CardResources::default());
        let program = cel::Program::compile(&cond).expect("the condition compiles");
        let selects = |pod: Value| {
            let mut ctx = cel::Context::default();
            ctx.add_variable_from_value("object", cel::to_value(&pod).expect("a CEL value"));
            program.execute(&ctx).expect("it evaluates") == cel::Value::Bool(true)
        };
        let pod = |resources: Value, annotations: Value| {
            json!({"metadata": {"name": "p", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "resources": resources}]}})
        };
        let gpus = |n: &str| json!({"limits": {"nvidia.com/gpu": n, "cpu": "1"}});
        assert!(selects(pod(gpus("1"), json!({}))));
        assert!(!selects(pod(gpus("0"), json!({}))), "gpu: 0 is cardless");
        assert!(!selects(pod(
            json!({"requests": {"nvidia.com/gpu": "0"}}),
            json!({})
        )));
        assert!(selects(pod(
            json!({"requests": {"nvidia.com/mig-1g.18gb": "2"}}),
            json!({})
        )));
        assert!(!selects(pod(json!({"limits": {"cpu": "1"}}), json!({}))));
        assert!(selects(pod(
            json!({}),
            json!({"volcano.sh/card.name": "NVIDIA-H200"})
        )));
    }

    /// The allocation hook's condition, evaluated as the API server would (CEL over the
    /// claim): a card driver's device selects it, unless every such device was given with
    /// admin access (a monitoring agent's, which takes no cards).
    #[test]
    fn the_card_drivers_condition_leaves_out_admin_access_and_other_drivers() {
        let cond = card_drivers_condition(&DraSettings::default());
        let program = cel::Program::compile(&cond).expect("the condition compiles");
        let selects = |results: Value| {
            let claim = json!({"metadata": {"name": "c"},
                "status": {"allocation": {"devices": {"results": results}}}});
            let mut ctx = cel::Context::default();
            ctx.add_variable_from_value("object", cel::to_value(&claim).expect("a CEL value"));
            program.execute(&ctx).expect("it evaluates") == cel::Value::Bool(true)
        };
        let result = |driver: &str, admin: Option<bool>| {
            let mut r = json!({"request": "gpu", "driver": driver, "pool": "n", "device": "gpu-0"});
            if let Some(a) = admin {
                r["adminAccess"] = json!(a);
            }
            r
        };
        assert!(selects(json!([result("gpu.nvidia.com", None)])));
        assert!(selects(json!([result("gpu.nvidia.com", Some(false))])));
        assert!(
            !selects(json!([result("gpu.nvidia.com", Some(true))])),
            "admin access only: no cards, no wait"
        );
        assert!(
            selects(json!([
                result("gpu.nvidia.com", Some(true)),
                result("gpu.nvidia.com", None)
            ])),
            "a card beside the admin's devices"
        );
        assert!(!selects(json!([result("nic.example.com", None)])));
    }

    #[test]
    fn a_url_gives_only_webhook_configurations_pointing_at_it() {
        let d = certs();
        crate::webhook::tls::generate("x", "y", &[], &[], &d.0).unwrap();
        let text = render(&Options {
            cert_dir: &d.0,
            url: Some("https://127.0.0.1:9443/"),
            without_match_conditions: true,
            no_pin: false,
            enforcement: crate::decide::Enforcement::Deny,
            namespace_enforcement: &Default::default(),
            image: None,
            name: Some("e2e"),
            namespace_label: Some(("card-quota-e2e", "x1")),
            scope: Scope::default(),
        })
        .unwrap();
        let docs = documents(&text).unwrap();
        assert!(docs.iter().all(is_webhook_config));
        let urls: Vec<&str> = docs
            .iter()
            .flat_map(|o| o["webhooks"].as_array().unwrap())
            .map(|h| h["clientConfig"]["url"].as_str().unwrap())
            .collect();
        assert!(urls.contains(&"https://127.0.0.1:9443/mutate"));
        assert!(urls.contains(&"https://127.0.0.1:9443/validate"));
        assert!(!text.contains("matchConditions"));
        assert!(
            !text.contains(CLAIM_PODS_HOOK),
            "the pod hooks see claim pods without conditions"
        );
        for o in &docs {
            assert_eq!(o["metadata"]["name"], "e2e");
            for h in o["webhooks"].as_array().unwrap() {
                if h["rules"][0]["scope"] != "Cluster" {
                    assert_eq!(
                        h["namespaceSelector"]["matchLabels"],
                        json!({"card-quota-e2e": "x1"})
                    );
                }
            }
        }
    }

    #[test]
    fn scope_flags_rename_the_install_and_the_card_resources_everywhere() {
        let d = certs();
        crate::webhook::tls::generate("card-quota", "gpu-quota", &[], &[], &d.0).unwrap();
        let text = render(&Options {
            cert_dir: &d.0,
            url: None,
            without_match_conditions: false,
            no_pin: false,
            enforcement: crate::decide::Enforcement::Deny,
            namespace_enforcement: &Default::default(),
            image: None,
            name: None,
            namespace_label: None,
            scope: Scope {
                namespace: "gpu-quota".into(),
                service_account: "cq".into(),
                cards: crate::cards::CardResources::parse(&[
                    "nvidia.com/gpu",
                    "cambricon.com/mlu*",
                ])
                .unwrap()
                .with_dra(
                    DraSettings::parse(
                        &["gpu.nvidia.com", "gpu.example.com=model"],
                        &["gpu.example.com"],
                    )
                    .unwrap(),
                ),
                binders: vec!["system:kube-scheduler".into(), "o'brien".into()],
            },
        })
        .unwrap();
        // Only the Service's name and labels still say card-quota.
        for o in documents(&text).unwrap() {
            if let Some(ns) = o["metadata"]["namespace"].as_str() {
                assert_eq!(ns, "gpu-quota", "{o}");
            }
        }
        assert!(!text.contains("namespace: card-quota"), "{text}");
        // Every card pod is checked whatever its scheduler; the pod hooks select exactly
        // the card resources given, and `serve` is given the same list.
        assert!(!text.contains("schedulerName"), "{text}");
        assert!(text.contains(
            "(r in ['nvidia.com/gpu'] || ['cambricon.com/mlu'].exists(p, r.startsWith(p)))"
        ));
        assert!(
            text.contains(r"request.userInfo.username in ['system:kube-scheduler', 'o\'brien']")
        );
        assert!(text.contains("request.userInfo.username != 'system:serviceaccount:gpu-quota:cq'"));
        assert!(text.contains("serviceAccountName: cq"));
        assert!(text.contains("--card-resource=nvidia.com/gpu"));
        assert!(text.contains("--card-resource=cambricon.com/mlu*"));
        // ... and the DRA drivers and classes, which the allocation hook selects.
        assert!(text.contains("r.driver in ['gpu.nvidia.com', 'gpu.example.com']"));
        for arg in [
            "--dra-driver=gpu.nvidia.com\n",
            "--dra-driver=gpu.example.com=model\n",
            "--dra-class=gpu.example.com\n",
        ] {
            assert!(text.contains(arg), "{arg} in {text}");
        }
        assert!(!text.contains("--scheduler-name"));
        assert!(!text.contains("volcano-system"));
    }
}
