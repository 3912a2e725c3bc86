//! Whole-card quantities: card resources are integers (DESIGN §9).

/// Parses a Kubernetes quantity that must be a whole, non-negative number of cards
/// (`2`, `2000m`, `1k`).
pub fn parse_whole(q: &str) -> Result<u64, String> {
    let q = q.trim();
    let (digits, mult, div) = if let Some(d) = q.strip_suffix('m') {
        (d, 1u64, 1000u64)
    } else if let Some(d) = q.strip_suffix('k') {
        (d, 1000, 1)
    } else if let Some(d) = q.strip_suffix("Ki") {
        (d, 1024, 1)
    } else {
        (q, 1, 1)
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("expected a whole number of cards, got {q:?}"))?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("quantity {q:?} is too large"))?;
    if n % div != 0 {
        return Err(format!("expected a whole number of cards, got {q:?}"));
    }
    Ok(n / div)
}

#[cfg(test)]
mod tests {
    use super::parse_whole;

    #[test]
    fn whole_quantities_parse_and_fractions_are_refused() {
        assert_eq!(parse_whole("3"), Ok(3));
        assert_eq!(parse_whole("2000m"), Ok(2));
        assert_eq!(parse_whole("1k"), Ok(1000));
        assert!(parse_whole("500m").is_err());
        assert!(parse_whole("-1").is_err());
        assert!(parse_whole("1.5").is_err());
    }
}
