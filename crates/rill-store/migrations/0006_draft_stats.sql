-- Issue 17. Speculative decoding's counts for an answer: how many draft tokens (prompt
-- lookup's or a draft model's) were proposed, and how many of them the model drew. The window
-- shows them under the answer; NULL where the answer did not speculate.
ALTER TABLE messages ADD COLUMN draft_proposed INTEGER;
ALTER TABLE messages ADD COLUMN draft_accepted INTEGER;
