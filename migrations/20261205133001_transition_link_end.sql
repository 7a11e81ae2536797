-- F3: a transition's answer carries its service link as it is now, ended
-- or not, so that a convert replayed after its service ended says so.
ALTER TYPE transition_result ADD ATTRIBUTE link_ended_at timestamptz, ADD ATTRIBUTE link_ended_by text;
