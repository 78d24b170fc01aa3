#!/usr/bin/env bash
# What users read speaks of the product, not of how it was built: no
# ticket numbers, work sessions, internal specification sections, source
# documents or notes about a development machine in the docs, schemas,
# SQL, deployment files, configuration comments, help texts, metric help
# or code comments. Prints each offending line and the count; exits 1 when
# there is any.
set -uo pipefail
cd "$(dirname "$0")/.."
paths=(README.md BENCHMARKS.md RELIABILITY.md CHANGELOG.md docs src schemas sql deploy
  reconciler.example.toml docker-compose.yml Dockerfile scripts benches examples fuzz/fuzz_targets)
# Kafka's and PostgreSQL's sessions (session.timeout.ms, a database
# session) are the product's words; "issue", "session" and "seed" in the
# sense of the work are not.
pattern='\bissues? #?[0-9]+|\b(this|that|the previous|the next|an earlier|a later|the last|one|two|three|four|five|earlier|later|previous|next) sessions?\b|\bsessions? (before|ago|later)\b|\bSPEC\b|\bseeds? ?0[0-9]{2}\b|\bseeds/|blocked on this machine|\bDESIGN\.md\b|\.\./shared/'
hits=$(grep -rnEI --exclude-dir=node_modules --exclude='check-product-words.sh' "$pattern" "${paths[@]}" 2>/dev/null || true)
count=$(printf '%s' "$hits" | grep -c . || true)
if [ "$count" -gt 0 ]; then
  printf '%s\n' "$hits"
  echo "product words check: $count line(s) speak of how the product was built (see above)"
  exit 1
fi
echo "product words check: 0 lines speak of how the product was built"
