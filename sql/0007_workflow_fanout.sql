-- Fan-out and cancellation of call trees in the workflow engine (docs/workflow.md).
-- Never edit this file once applied: later changes go in a new numbered file.

-- While an invocation is suspended in awaitAll(), how many of the promises it waits for were
-- still pending when it suspended. Settling one of its promises counts down instead of waking it,
-- so a fan-out of N calls is woken once, not N times. NULL: any settle wakes it.
ALTER TABLE workflow_invocations ADD COLUMN waiting_for INT NULL AFTER wake_seq;

-- A cancel reaches the invocations a cancelled one called (its children, and theirs).
ALTER TABLE workflow_invocations ADD KEY workflow_invocations_parent (parent_id);
