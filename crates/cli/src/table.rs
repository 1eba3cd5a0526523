//! Kyverno's box tables (`│` and `─`), headers upper-cased.

pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let sep: String = format!("│{}│\n", widths.iter().map(|w| "─".repeat(w + 2)).collect::<Vec<_>>().join("│"));
    let line = |cells: Vec<String>| -> String {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let w = widths.get(i).copied().unwrap_or(0);
                format!(" {c}{} ", " ".repeat(w.saturating_sub(c.chars().count())))
            })
            .collect();
        format!("│{}│\n", parts.join("│"))
    };
    let mut out = String::new();
    out.push_str(&sep);
    out.push_str(&line(headers.iter().map(|h| h.to_uppercase()).collect()));
    out.push_str(&sep);
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out.push_str(&sep);
    out
}
