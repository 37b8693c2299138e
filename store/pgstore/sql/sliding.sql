-- sliding.sql: the decision of a statement that carries sliding windows,
-- in place of {{EVAL}}: eval.sql for the other kinds, slide.sql for kind 4.
-- Each branch is gated by the row's kind alone (a one-time filter per
-- row), so a row runs one of them. Statements without a sliding window
-- include eval.sql alone, and pay nothing for this.
SELECT * FROM ({{BUCKET}}) x WHERE i.kind <> 4
UNION ALL
SELECT * FROM ({{SLIDE}}) y WHERE i.kind = 4
