// The engine tests of test_engine.cpp again with scheduling ahead forced on
// (EngineConfig::schedule_ahead = 1): the fake model's greedy and sampled passes then go through
// Model's two-call defaults (begin_greedy, begin_sample), each begun one step before the picks of
// the step before it are read, and every oracle must still hold.
#define PAGEDATTN_ENGINE_SUITE EngineScheduledAhead
#define PAGEDATTN_ASYNC_SUITE AsyncEngineScheduledAhead
#define PAGEDATTN_SCHEDULE_AHEAD 1
#include "test_engine.cpp"  // NOLINT(bugprone-suspicious-include)
