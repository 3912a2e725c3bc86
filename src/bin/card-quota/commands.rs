//! The short subcommands: each turns its flags into a call to the library.

use card_quota::cli::{check, manifests, preflight, replay, status};
use card_quota::decide::{Config, NamespaceEnforcement};

use crate::args::{
    no_scheduler_filter, CertsArgs, CheckArgs, ManifestsArgs, ReplayArgs, StatusArgs,
};
use crate::snapshots::{
    live_install, live_queues, live_snapshot, namespace_snapshot, snapshot_file,
};

pub fn check(a: CheckArgs) -> anyhow::Result<()> {
    let cards = a.cards.settings()?;
    let manifest = if a.filename.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        crate::snapshots::read_objects(&a.filename)?
    };
    let mut snap = match &a.objects {
        Some(path) => snapshot_file(path, &cards)?,
        None => tokio::runtime::Runtime::new()?.block_on(live_snapshot(&cards, &a.cluster))?,
    };
    let cfg = Config {
        enforcement: a.enforcement.into(),
        ..Config::default()
    };
    let verdicts = check::check(
        &mut snap,
        &manifest,
        &a.namespace,
        &cfg,
        jiff::Timestamp::now(),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", a.filename.display()))?;
    match a.output {
        status::Format::Table => print!("{}", check::table(&verdicts)),
        status::Format::Json => println!("{}", serde_json::to_string_pretty(&verdicts)?),
        status::Format::Yaml => print!("{}", serde_norway::to_string(&verdicts)?),
    }
    if verdicts.iter().any(|v| v.outcome.holds_back()) {
        use std::io::Write;
        std::io::stdout().flush()?;
        std::process::exit(2);
    }
    Ok(())
}

pub fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    let cfg = Config {
        scale_policy: a.scale_policy.into(),
        pin: !a.no_pin,
        enforcement: a.enforcement.into(),
        full: a.card_full.into(),
        namespace_enforcement: NamespaceEnforcement::parse(&a.namespace_enforcement)?,
        max_queue_depth: a.max_queue_depth,
        any_model: false,
    };
    no_scheduler_filter(&a.scheduler_names);
    replay::run(
        &a.objects,
        &a.requests,
        a.output,
        a.decode_patches,
        &cfg,
        &a.cards.settings()?,
        &mut std::io::stdout().lock(),
    )?;
    Ok(())
}

pub fn certs(a: CertsArgs) -> anyhow::Result<()> {
    use base64::Engine;
    use card_quota::webhook::certs::{issue, Mode, Names};
    let mode = match (a.renew, a.rotate_ca, a.drop_previous_ca, a.force) {
        (true, ..) => Mode::Renew,
        (_, true, ..) => Mode::RotateCa,
        (_, _, true, _) => Mode::DropPreviousCa,
        (.., true) => Mode::Force,
        _ => Mode::New,
    };
    let names = Names {
        service: a.service,
        namespace: a.namespace,
        dns: a.dns,
        ips: a.ip,
    };
    let bundle = issue(&names, &a.out, mode)?;
    let dir = a.out.display();
    eprintln!(
        "{}",
        match mode {
            Mode::Renew => format!("wrote {dir}/tls.crt, {dir}/tls.key under the kept CA; the caBundle is unchanged"),
            Mode::RotateCa => format!("wrote a new CA and certificate in {dir}; the old CA is {dir}/ca-previous.crt. Apply `card-quota manifests` (caBundle: both CAs), wait until every replica serves the new certificate, then run certs --drop-previous-ca and apply again"),
            Mode::DropPreviousCa => format!("removed {dir}/ca-previous.crt; apply `card-quota manifests` again"),
            Mode::New | Mode::Force => format!("wrote {dir}/ca.crt, {dir}/ca.key (keep it private), {dir}/tls.crt, {dir}/tls.key for {}", names.service_host()),
        }
    );
    println!(
        "{}",
        base64::engine::general_purpose::STANDARD.encode(bundle)
    );
    Ok(())
}

pub fn manifests(a: ManifestsArgs) -> anyhow::Result<()> {
    let default = manifests::Scope::default();
    no_scheduler_filter(&a.scheduler_names);
    let scope = manifests::Scope {
        namespace: a.namespace,
        service_account: a.service_account,
        cards: a.cards.settings()?,
        binders: if a.binders.is_empty() {
            default.binders
        } else {
            a.binders
        },
    };
    print!(
        "{}",
        manifests::render(&manifests::Options {
            scope,
            cert_dir: &a.cert_dir,
            url: a.url.as_deref(),
            without_match_conditions: a.without_match_conditions,
            no_pin: a.no_pin,
            enforcement: a.enforcement.into(),
            namespace_enforcement: &NamespaceEnforcement::parse(&a.namespace_enforcement)?,
            image: a.image.as_deref(),
            name: a.name.as_deref(),
            namespace_label: a
                .namespace_label
                .as_ref()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        })?
    );
    Ok(())
}

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    no_scheduler_filter(&a.scheduler_names);
    let cards = a.cards.settings()?;
    if let (true, Some(path)) = (a.would_refuse, &a.objects) {
        let text = crate::snapshots::read_objects(path)?;
        let found = preflight::preflight(&text, &cards, &Config::default())?;
        for s in &found.skipped {
            tracing::warn!("{}: {s}", path.display());
        }
        let refused = found.refused;
        match a.output {
            status::Format::Table => print!(
                "{}{}",
                preflight::table(&refused),
                preflight::suggestions_table(&found.suggestions)
            ),
            status::Format::Json => println!("{}", serde_json::to_string_pretty(&refused)?),
            status::Format::Yaml => print!("{}", serde_norway::to_string(&refused)?),
        }
        return Ok(());
    }
    let scope = status::Scope::queue(a.queue.as_deref());
    let (snap, install) = match a.objects {
        Some(path) => (snapshot_file(&path, &cards)?, status::Install::default()),
        None if a.recount => {
            let rt = tokio::runtime::Runtime::new()?;
            let install = rt.block_on(live_install(&a.cluster))?;
            (rt.block_on(live_snapshot(&cards, &a.cluster))?, install)
        }
        None => {
            // What the reconciler wrote: reading Queues is all it takes (and, with -n,
            // the namespace's pods and PodGroups to know which queues it uses).
            let rt = tokio::runtime::Runtime::new()?;
            let queues = rt.block_on(live_queues(&a.cluster))?;
            let install = rt.block_on(live_install(&a.cluster))?;
            let scope = match &a.namespace {
                Some(ns) => {
                    let used = rt.block_on(namespace_snapshot(&cards, &a.cluster, ns))?;
                    scope.in_namespace(ns, &used)
                }
                None => scope,
            };
            let rows = status::written_rows(&queues, &scope, install)?;
            print!("{}", status::render_scoped(&rows, &scope, a.output)?);
            return Ok(());
        }
    };
    let scope = match &a.namespace {
        Some(ns) => scope.in_namespace(ns, &snap),
        None => scope,
    };
    print!(
        "{}",
        status::render(&snap, &scope, install, a.output, jiff::Timestamp::now())?
    );
    Ok(())
}

/// `ungate`: removes card-quota's gate from every waiting pod (an uninstall's last step).
pub fn ungate(a: crate::args::UngateArgs) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let cluster = crate::args::ClusterArgs {
        kubeconfig: a.kubeconfig,
        context: a.context,
    };
    tokio::runtime::Runtime::new()?.block_on(async move {
        let client = crate::snapshots::client_for(&cluster).await?;
        let api: kube::Api<Pod> = match &a.namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        };
        let mut params = kube::api::ListParams::default().limit(500);
        let mut waiting = Vec::new();
        loop {
            let page = anyhow::Context::context(api.list(&params).await, "listing pods")?;
            for p in &page.items {
                let gated = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.scheduling_gates.as_ref())
                    .is_some_and(|g| {
                        g.iter()
                            .any(|g| g.name == card_quota::cards::annotations::WAIT_GATE)
                    });
                if gated {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let name = p.metadata.name.clone().unwrap_or_default();
                    waiting.push((
                        card_quota::cards::ObjectKey::new(ns, name),
                        p.metadata.uid.clone(),
                    ));
                }
            }
            match page.metadata.continue_.as_deref() {
                Some(c) if !c.is_empty() => params = params.continue_token(c),
                _ => break,
            }
        }
        let mut failed = 0;
        for (pod, uid) in &waiting {
            if a.dry_run {
                println!("pod {pod} waits behind {}", card_quota::cards::annotations::WAIT_GATE);
                continue;
            }
            match card_quota::controller::releaser::ungate(&client, pod, uid.as_deref()).await {
                Ok(()) => println!("pod {pod} ungated"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    failed += 1;
                    eprintln!("pod {pod}: {e}");
                }
            }
        }
        println!(
            "{} pods {}",
            waiting.len(),
            if a.dry_run { "wait" } else { "were waiting" }
        );
        if failed > 0 {
            anyhow::bail!("{failed} pods could not be ungated (is card-quota's pod webhook still installed? remove it first)");
        }
        Ok(())
    })
}
