--[[ gpuhpc job_submit.lua: refuse, at submit time, a job that cannot fit its account's budget.

Installed next to slurm.conf (JobSubmitPlugins=lua) by the gpuhpc_slurm_controller role. It reads
ONLY the budget snapshot that `gpuhpc ledger sync-slurm` publishes (gpuhpc-budgets.txt, in this
file's directory), never the ledger database. Slurm itself binds the budgets (GrpTRESMins on the
account association, AccountingStorageEnforce=...,safe); this script only turns a plainly
impossible job (its own worst case is larger than what is left) into an immediate, readable
refusal:

  account research: budget $1,000.00 for 2026-11, $3.20 left; this job may cost $40.00

Snapshot lines (tab-separated; docs/ledger.md):
  rate    <partition|*>  <gpu type|*>  <price per device-hour, multipliers applied>
  weight  <gpu type>  <GPU-hours one such GPU counts for an hour: a MIG slice its fraction, "1/7">
  budget  <account>  <user|*>  <money|gpu_hours>  <period label>  <period end, epoch s; 0 = none>  <budget>  <left>
  qos     <account>  <budget QOS>     (ledger enforcement "qos": the account's budget is that QOS, NoDecay)

In the qos mode every job of such an account runs in its budget QOS: a job that asks for none is put
there, a job that asks for another QOS is refused (a job has one QOS; any other would escape the
budget). sync-slurm also makes the budget QOS the associations' DefaultQOS, so a job that reaches
slurmctld without this script still lands in it.
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
    local snap = { rates = {}, budgets = {}, weights = {}, qos = {}, currency = "USD" }
    for line in fh:lines() do
        local f = split(line)
        if f[1] == "currency" then
            snap.currency = f[2]
        elseif f[1] == "rate" then
            snap.rates[f[2] .. "\t" .. f[3]] = tonumber(f[4])
        elseif f[1] == "weight" then
            -- the ledger's weights (gpuhpc.ledger.pricing.gpu_weight), exact fractions: "1/7", "3/7"
            local n, d = (f[3] or ""):match("^(%d+)/(%d+)$")
            local w = n and tonumber(d) > 0 and tonumber(n) / tonumber(d) or tonumber(f[3])
            if w ~= nil and w > 0 then snap.weights[f[2]] = w end
        elseif f[1] == "qos" and f[2] ~= nil and f[3] ~= nil and f[3] ~= "" then
            snap.qos[f[2]] = f[3]
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

local NO_VAL16 = 65534
local INFINITE16 = 65535

-- a number field of a job: nil when unset (Slurm passes NO_VAL/NO_VAL16 or nothing)
local function num(v)
    v = tonumber(v)
    if v == nil or v <= 0 or v == NO_VAL or v == INFINITE or v == NO_VAL16 or v == INFINITE16 then return nil end
    return v
end

-- GPU type (or nil) and count in a GRES/TRES string, in every form Slurm 22.05 takes or prints:
-- "gres:gpu:h100:2", "gres/gpu:h100:2", "gpu:2", "gpu:h100" (1), "gpu" and "gres:gpu" (1),
-- "gres/gpu=2", "gres/gpu:h100=2", "gpu:h100:2(S:0-1)", several comma-separated items (summed)
local function gpus_in(tres)
    if tres == nil or tres == "" then return nil, 0 end
    local total, typ = 0, nil
    for item in tostring(tres):gmatch("[^,]+") do
        local rest = item:gsub("^%s+", ""):gsub("^gres[:/]", ""):gsub("%(.*%)$", "")
        local name, tail = rest:match("^([^:=]+)(.*)$")
        if name == "gpu" then
            local t, n
            local a, b = tail:match("^:([^:=]+)[:=](%d+)$")
            if a then
                t, n = a, tonumber(b)
            else
                local c = tail:match("^[:=](%d+)$")
                if c then
                    n = tonumber(c)
                else
                    local d = tail:match("^:([^:=]+)$")
                    if d then t, n = d, 1 elseif tail == "" then n = 1 end
                end
            end
            if n then
                total = total + n
                typ = typ or t
            end
        end
    end
    return typ, total
end

-- how many tasks an --array index list makes ("0-99%5", "1,3,5-9:2"); 1 for a plain job
local function array_tasks(inx)
    if inx == nil or inx == "" then return 1 end
    local n = 0
    for part in tostring(inx):gsub("%%.*$", ""):gmatch("[^,]+") do
        local a, b, step = part:match("^(%d+)-(%d+):?(%d*)$")
        if a then
            step = math.max(tonumber(step) or 1, 1)
            n = n + math.floor((tonumber(b) - tonumber(a)) / step) + 1
        elseif part:match("^%d+$") then
            n = n + 1
        end
    end
    return math.max(n, 1)
end

-- GPU type and the fewest GPUs a job holds, from every way to ask for them: --gpus (tres_per_job),
-- --gres/--gpus-per-node (tres_per_node, per node), --gpus-per-socket (tres_per_socket, per
-- socket of every node), --gpus-per-task (tres_per_task, per task). get(field) reads the job.
-- The largest of them: Slurm gives the job at least that many (never counted twice).
local function job_gpus(get)
    local nodes = num(get("min_nodes")) or 1
    local best, typ = 0, nil
    local function consider(t, n)
        if n > best then best = n end
        if n > 0 then typ = typ or t end
    end
    local t, n = gpus_in(get("tres_per_job"))
    consider(t, n)
    t, n = gpus_in(get("tres_per_node"))
    consider(t, n * nodes)
    t, n = gpus_in(get("tres_per_socket"))
    consider(t, n * (num(get("sockets_per_node")) or 1) * nodes)
    t, n = gpus_in(get("tres_per_task"))
    local tasks = num(get("num_tasks")) or ((num(get("ntasks_per_node")) or 1) * nodes)
    consider(t, n * tasks)
    return typ, best
end

local function money(currency, v)
    local s = string.format("%.2f", v)
    local int, frac = s:match("^(-?%d+)(%.%d+)$")
    int = int:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^(-?),", "%1")
    local sym = (currency == "USD") and "$" or (currency .. " ")
    return sym .. int .. frac
end

-- the time limit Slurm gives a job that asked for none: its partition's DefaultTime, else its
-- MaxTime (nil when unlimited: then Slurm's own GrpTRESMins with "safe" keeps it from starting)
local function partition_minutes(part_list, name)
    if type(part_list) ~= "table" then return nil end
    local part = name and part_list[name]
    if part == nil and name == nil then
        for _, p in pairs(part_list) do
            if p.flag_default == 1 then part = p break end
        end
    end
    if part == nil then return nil end
    return num(part.default_time) or num(part.max_time)
end

-- the budget message when the job (fields read with get) cannot fit, else nil
local function check(get)
    local snap = load_snapshot()
    if not snap then return nil end
    local account = get("account") or get("default_account")
    if account == nil or snap.budgets[account] == nil then return nil end
    local minutes = num(get("time_limit"))
    if minutes == nil then return nil end
    local typ, gpus = job_gpus(get)
    gpus = gpus * array_tasks(get("array_inx"))
    if gpus <= 0 then return nil end
    local part = get("partition") or "*"
    if part:find(",") then return nil end              -- several partitions: Slurm decides
    local rate = snap.rates[part .. "\t" .. (typ or "*")] or snap.rates["*\t" .. (typ or "*")]
    local user = get("user_name")
    local now = os.time()
    for _, b in ipairs(snap.budgets[account]) do
        if (b.user == "*" or b.user == user) and (b.ends == 0 or b.ends > now) and b.left ~= nil then
            local need, fmt
            if b.kind == "money" and rate ~= nil then
                need = gpus * minutes / 60 * rate
                fmt = function(v) return money(snap.currency, v) end
            elseif b.kind == "gpu_hours" then
                -- a MIG slice counts its fraction of a GPU, as the ledger counts it (untyped: a whole GPU)
                need = gpus * (snap.weights[typ or ""] or 1) * minutes / 60
                fmt = function(v) return string.format("%.2f GPU-hours", v) end
            end
            -- rounded to the ledger's 6 decimals, as gpuhpc submit rounds it (budget.job_need)
            if need ~= nil then need = math.floor(need * 1e6 + 0.5) / 1e6 end
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

-- the qos mode: the account's budget QOS (nil: none), and the refusal when the job asks for another
local function budget_qos(account, asked)
    local snap = load_snapshot()
    if not snap or account == nil or snap.qos[account] == nil then return nil, nil end
    local want = snap.qos[account]
    if asked ~= nil and asked ~= "" and string.lower(tostring(asked)) ~= string.lower(want) then
        return want, string.format("account %s: its budget is the QOS %s, which every job of the account runs in; "
                                   .. "this job asks for QOS %s (submit without --qos, or with --qos=%s)",
                                   account, want, tostring(asked), want)
    end
    return want, nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local function get(k)
        if k == "time_limit" and num(job_desc.time_limit) == nil then
            return partition_minutes(part_list, job_desc.partition)
        end
        return job_desc[k]
    end
    local qok, want, refusal = pcall(budget_qos, job_desc.account or job_desc.default_account, job_desc.qos)
    if qok and refusal then
        slurm.log_user("%s", refusal)
        slurm.log_info("gpuhpc budget: refused a job of uid %s: %s", tostring(submit_uid), refusal)
        return slurm.ERROR
    end
    if qok and want then
        job_desc.qos = want
    elseif not qok then
        slurm.log_error("gpuhpc job_submit.lua: %s (QOS left as asked)", tostring(want))
    end
    local ok, msg = pcall(check, get)
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

-- the fields that size a job (GPUs x time x tasks) or choose its budget
local SIZE_FIELDS = { "tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task", "min_nodes",
                      "num_tasks", "ntasks_per_node", "sockets_per_node", "time_limit", "account", "partition" }

-- an update (`scontrol update JobId=...`) that makes a pending job bigger is held to the same
-- budget as a submission: the job as it would be after the update (the update's fields over the
-- job's own) must fit, unless it is no bigger than it was. An administrator's (uid 0) update is
-- theirs to make. (Slurm 22.05 shows no log_user message on modify: the user sees an error and
-- slurmctld's log says why.)
local function check_modify(job_desc, job_rec, modify_uid)
    if tonumber(modify_uid) == 0 then return nil end
    local changed = false
    for _, k in ipairs(SIZE_FIELDS) do
        local v = job_desc[k]
        if v ~= nil and v ~= "" and (type(v) ~= "number" or num(v) ~= nil) then changed = true end
    end
    if not changed then return nil end
    local function get(k)
        local v = job_desc[k]
        if v == nil or v == "" or (type(v) == "number" and num(v) == nil) then
            if k == "user_name" then return job_rec.user_name end
            return job_rec[k]
        end
        return v
    end
    local _, before = gpus_in((tostring(job_rec.tres_req_str or ""):match("gres/gpu=%d+")))
    local typ, after = job_gpus(get)
    after = math.max(after, before)
    local old_min, new_min = num(job_rec.time_limit) or 0, num(get("time_limit")) or 0
    if after * new_min <= before * old_min and get("account") == job_rec.account
        and get("partition") == job_rec.partition then
        return nil
    end
    -- a pending array's update applies to each of its pending tasks
    local total = after * (num(job_rec.array_task_cnt) or 1)
    return check(function(k)
        if k == "tres_per_job" then                        -- the job's count, as computed above
            return typ and ("gres:gpu:" .. typ .. ":" .. total) or ("gres:gpu:" .. total)
        end
        if k == "tres_per_node" or k == "tres_per_socket" or k == "tres_per_task" or k == "array_inx" then return nil end
        return get(k)
    end)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    -- the qos mode: a pending job of a budgeted account stays in its budget QOS (an administrator may move it)
    if tonumber(modify_uid) ~= 0 and job_desc.qos ~= nil and job_desc.qos ~= "" then
        local qok, _, refusal = pcall(budget_qos, job_desc.account or job_rec.account, job_desc.qos)
        if qok and refusal then
            slurm.log_user("%s", refusal)
            slurm.log_info("gpuhpc budget: refused an update of job %s by uid %s: %s", tostring(job_rec.job_id),
                           tostring(modify_uid), refusal)
            return slurm.ERROR
        end
    end
    local ok, msg = pcall(check_modify, job_desc, job_rec, modify_uid)
    if ok and msg then
        slurm.log_user("%s", msg)
        slurm.log_info("gpuhpc budget: refused an update of job %s by uid %s: %s", tostring(job_rec.job_id),
                       tostring(modify_uid), msg)
        return slurm.ERROR
    end
    if not ok then
        slurm.log_error("gpuhpc job_submit.lua: %s (update let through)", tostring(msg))
    end
    return slurm.SUCCESS
end

return slurm.SUCCESS
