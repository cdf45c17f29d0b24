--[[ gpuhpc job_submit.lua: refuse, at submit time, a job that cannot fit its account's budget.

Installed next to slurm.conf (JobSubmitPlugins=lua) by the gpuhpc_slurm_controller role. It reads
ONLY the budget snapshot that `gpuhpc ledger sync-slurm` publishes (gpuhpc-budgets.txt, in this
file's directory), never the ledger database. Slurm itself binds the budgets (GrpTRESMins on the
account association, AccountingStorageEnforce=...,safe); this script only turns a plainly
impossible job (its own worst case is larger than what is left) into an immediate, readable
refusal:

  account research: budget $1,000.00 for 2026-11, $3.20 left; this job may cost $40.00

Snapshot lines (tab-separated; docs/ledger.md):
  rate    <partition|*>  <gpu type|*>  <price per GPU-hour, multipliers applied>
  budget  <account>  <user|*>  <money|gpu_hours>  <period label>  <period end, epoch s; 0 = none>  <budget>  <left>
Anything unexpected (no snapshot, a parse error, a field this Slurm lacks) lets the job through:
this script must never be the reason a job is refused wrongly.
]]

local NO_VAL = 4294967294
local INFINITE = 4294967295

local function script_dir()
    local src = debug.getinfo(1, "S").source
    return (src:match("^@(.*)/[^/]*$")) or "/etc/slurm"
end

local SNAPSHOT = script_dir() .. "/gpuhpc-budgets.txt"

local function split(line)
    local out = {}
    for f in (line .. "\t"):gmatch("([^\t]*)\t") do out[#out + 1] = f end
    return out
end

local function load_snapshot()
    local fh = io.open(SNAPSHOT, "r")
    if not fh then return nil end
    local snap = { rates = {}, budgets = {}, currency = "USD" }
    for line in fh:lines() do
        local f = split(line)
        if f[1] == "currency" then
            snap.currency = f[2]
        elseif f[1] == "rate" then
            snap.rates[f[2] .. "\t" .. f[3]] = tonumber(f[4])
        elseif f[1] == "budget" then
            local list = snap.budgets[f[2]] or {}
            list[#list + 1] = { user = f[3], kind = f[4], label = f[5], ends = tonumber(f[6]) or 0,
                                budget = tonumber(f[7]), left = tonumber(f[8]) }
            snap.budgets[f[2]] = list
        end
    end
    fh:close()
    return snap
end

-- "gres:gpu:h100:2", "gres/gpu:2", "gpu:1g.10gb:1" -> type (or nil), count
local function gpus_in(tres)
    if tres == nil or tres == "" then return nil, 0 end
    local total, typ = 0, nil
    for item in tostring(tres):gmatch("[^,]+") do
        local rest = item:gsub("^gres[:/]", "")
        local name, a, b = rest:match("^([^:]+):?([^:]*):?([^:]*)$")
        if name == "gpu" then
            local n = tonumber(b) or tonumber(a) or 1
            if b ~= "" and tonumber(b) then typ = a elseif a ~= "" and not tonumber(a) then typ = a end
            total = total + n
        end
    end
    return typ, total
end

local function money(currency, v)
    local s = string.format("%.2f", v)
    local int, frac = s:match("^(-?%d+)(%.%d+)$")
    int = int:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^(-?),", "%1")
    local sym = (currency == "USD") and "$" or (currency .. " ")
    return sym .. int .. frac
end

local function check(job_desc, submit_uid)
    local snap = load_snapshot()
    if not snap then return nil end
    local account = job_desc.account or job_desc.default_account
    if account == nil or snap.budgets[account] == nil then return nil end
    local minutes = job_desc.time_limit
    if minutes == nil or minutes == NO_VAL or minutes == INFINITE then return nil end
    local typ, per_node = gpus_in(job_desc.tres_per_node)
    local nodes = job_desc.min_nodes
    if nodes == nil or nodes == NO_VAL or nodes == 0 then nodes = 1 end
    local gpus = per_node * nodes
    local t2, per_job = gpus_in(job_desc.tres_per_job)
    gpus = gpus + per_job
    typ = typ or t2
    if gpus <= 0 then return nil end
    local part = job_desc.partition or "*"
    if part:find(",") then return nil end              -- several partitions: Slurm decides
    local rate = snap.rates[part .. "\t" .. (typ or "*")] or snap.rates["*\t" .. (typ or "*")]
    local user = job_desc.user_name
    local now = os.time()
    for _, b in ipairs(snap.budgets[account]) do
        if (b.user == "*" or b.user == user) and (b.ends == 0 or b.ends > now) and b.left ~= nil then
            local need, fmt
            if b.kind == "money" and rate ~= nil then
                need = gpus * minutes / 60 * rate
                fmt = function(v) return money(snap.currency, v) end
            elseif b.kind == "gpu_hours" then
                need = gpus * minutes / 60
                fmt = function(v) return string.format("%.2f GPU-hours", v) end
            end
            if need ~= nil and need > b.left + 1e-9 then
                local who = (b.user == "*") and ("account " .. account) or ("user " .. b.user .. " in account " .. account)
                local verb = (b.kind == "money") and "cost" or "use"
                return string.format("%s: budget %s for %s, %s left; this job may %s %s",
                                     who, fmt(b.budget), b.label, fmt(math.max(b.left, 0)), verb, fmt(need))
            end
        end
    end
    return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, msg = pcall(check, job_desc, submit_uid)
    if ok and msg then
        slurm.log_user("%s", msg)
        slurm.log_info("gpuhpc budget: refused a job of uid %s: %s", tostring(submit_uid), msg)
        return slurm.ERROR
    end
    if not ok then
        slurm.log_error("gpuhpc job_submit.lua: %s (job let through)", tostring(msg))
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
