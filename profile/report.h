// profile/report.h: report.html, the profile a person opens (docs/profile.md): one self-contained file (no
// network: its data, style and script are inside it) drawn from profile.json's text by the script it holds.
// Views so far: Summary (the run's facts, its wall time, each device's busy share) and Operations (per
// device, each op's count, time, share of the device's busy time as a bar, mean and GB/s; sortable).
#pragma once

#include <string>

namespace aspen::profile {

// The HTML page for `profile_json` (profile_json()'s text, schema aspen.profile/1). Once drawn, the page's
// element #status reads "drawn"; a script error puts "error: ..." there instead (the test in a headless
// browser reads it).
std::string report_html(const std::string& profile_json);

}  // namespace aspen::profile
