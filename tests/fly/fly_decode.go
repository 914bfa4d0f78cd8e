// Decodes Souq's answers into the types a Fly Machines-API client declares for them (field names
// and Go types as in the API's contract), with encoding/json, the way such a client reads an
// answer: json.NewDecoder(body).Decode(&out). Reads JSON lines {"kind": KIND, "body": TEXT} on
// stdin (TEXT: the answer's body, as sent); prints, per line, "ok " and the decoded value
// re-encoded (what the client understood), or "error: " and the decode error.
//
// Kinds: machine, machines, start, lease, exec, ps, metadata, app, apps, secrets, secret,
// secret_set, secret_delete, secrets_update, volume, volumes, volume_extend, snapshots,
// flaps_error, error_status.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Durations: a string Go's time.ParseDuration reads, null (zero), or a number of nanoseconds.
type duration struct{ time.Duration }

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *duration) UnmarshalJSON(b []byte) error {
	var v interface{}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch value := v.(type) {
	case nil:
		d.Duration = 0
	case float64:
		d.Duration = time.Duration(int64(value))
	case string:
		parsed, err := time.ParseDuration(value)
		if err != nil {
			return err
		}
		d.Duration = parsed
	default:
		return fmt.Errorf("unknown duration type: %T", value)
	}
	return nil
}

// A service's autostop: true/false, or "off", "stop", "suspend".
type autostop int

// As the client sends it back: false (off), true (stop) or "suspend".
func (s autostop) MarshalJSON() ([]byte, error) {
	return []byte([]string{"false", "true", `"suspend"`}[s]), nil
}

func (s *autostop) UnmarshalJSON(raw []byte) error {
	if bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var asBool bool
	if err := json.Unmarshal(raw, &asBool); err == nil {
		if asBool {
			*s = 1
		} else {
			*s = 0
		}
		return nil
	}
	var asString string
	if err := json.Unmarshal(raw, &asString); err == nil {
		switch asString {
		case "off":
			*s = 0
		case "stop":
			*s = 1
		case "suspend":
			*s = 2
		default:
			return fmt.Errorf("invalid autostop string value %q", asString)
		}
		return nil
	}
	return errors.New("autostop value is not a valid bool or string")
}

// persist_rootfs: "", "none", "never", "restart", "always", or 0..3.
type persistRootfs string

func (p *persistRootfs) UnmarshalJSON(raw []byte) error {
	if bytes.Equal(raw, []byte("null")) {
		return nil
	}
	var asString string
	err := json.Unmarshal(raw, &asString)
	if err == nil {
		switch asString {
		case "", "none", "never", "restart", "always":
			*p = persistRootfs(asString)
			return nil
		}
		return fmt.Errorf("invalid persist_rootfs string value %q", asString)
	}
	var asInt int
	if json.Unmarshal(raw, &asInt) != nil || asInt < 0 || asInt > 3 {
		return err
	}
	*p = persistRootfs([]string{"", "never", "restart", "always"}[asInt])
	return nil
}

type imageRef struct {
	Registry   string            `json:"registry,omitempty"`
	Repository string            `json:"repository,omitempty"`
	Tag        string            `json:"tag,omitempty"`
	Digest     string            `json:"digest,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

type exitEvent struct {
	ExitCode      int       `json:"exit_code,omitempty"`
	GuestExitCode int       `json:"guest_exit_code,omitempty"`
	GuestSignal   int       `json:"guest_signal,omitempty"`
	OOMKilled     bool      `json:"oom_killed,omitempty"`
	RequestedStop bool      `json:"requested_stop,omitempty"`
	Restarting    bool      `json:"restarting,omitempty"`
	Signal        int       `json:"signal,omitempty"`
	ExitedAt      time.Time `json:"exited_at"`
}

type monitorEvent struct {
	ExitEvent *exitEvent `json:"exit_event,omitempty"`
}

type machineRequest struct {
	ExitEvent    *exitEvent    `json:"exit_event,omitempty"`
	MonitorEvent *monitorEvent `json:"MonitorEvent,omitempty"`
	RestartCount int           `json:"restart_count,omitempty"`
}

type machineEvent struct {
	Type      string          `json:"type,omitempty"`
	Status    string          `json:"status,omitempty"`
	Request   *machineRequest `json:"request,omitempty"`
	Source    string          `json:"source,omitempty"`
	Timestamp int64           `json:"timestamp,omitempty"`
}

type checkStatus struct {
	Name      string     `json:"name,omitempty"`
	Status    string     `json:"status,omitempty"`
	Output    string     `json:"output,omitempty"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

type containerStatus struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

type machineInit struct {
	Exec       []string `json:"exec,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Tty        bool     `json:"tty,omitempty"`
	SwapSizeMB *int     `json:"swap_size_mb,omitempty"`
	KernelArgs []string `json:"kernel_args,omitempty"`
}

type machineGuest struct {
	CPUKind          string        `json:"cpu_kind,omitempty"`
	CPUs             int           `json:"cpus,omitempty"`
	MemoryMB         int           `json:"memory_mb,omitempty"`
	MaxMemoryMB      int           `json:"max_memory_mb,omitempty"`
	GPUs             int           `json:"gpus,omitempty"`
	GPUKind          string        `json:"gpu_kind,omitempty"`
	HostDedicationID string        `json:"host_dedication_id,omitempty"`
	PersistRootfs    persistRootfs `json:"persist_rootfs,omitempty"`
	KernelArgs       []string      `json:"kernel_args,omitempty"`
}

type machineMount struct {
	Encrypted              bool   `json:"encrypted,omitempty"`
	Path                   string `json:"path,omitempty"`
	SizeGb                 int    `json:"size_gb,omitempty"`
	Volume                 string `json:"volume,omitempty"`
	Name                   string `json:"name,omitempty"`
	ExtendThresholdPercent int    `json:"extend_threshold_percent,omitempty"`
	AddSizeGb              int    `json:"add_size_gb,omitempty"`
	SizeGbLimit            int    `json:"size_gb_limit,omitempty"`
}

type httpHeader struct {
	Name   string   `json:"name,omitempty"`
	Values []string `json:"values,omitempty"`
}

// A machine's check is a service's check with a kind (embedded: its fields decode in place).
type machineCheck struct {
	serviceCheck
	Kind *string `json:"kind,omitempty"`
}

type serviceCheck struct {
	Port              *int         `json:"port,omitempty"`
	Type              *string      `json:"type,omitempty"`
	Interval          *duration    `json:"interval,omitempty"`
	Timeout           *duration    `json:"timeout,omitempty"`
	GracePeriod       *duration    `json:"grace_period,omitempty"`
	HTTPMethod        *string      `json:"method,omitempty"`
	HTTPPath          *string      `json:"path,omitempty"`
	HTTPProtocol      *string      `json:"protocol,omitempty"`
	HTTPSkipTLSVerify *bool        `json:"tls_skip_verify,omitempty"`
	HTTPTLSServerName *string      `json:"tls_server_name,omitempty"`
	HTTPHeaders       []httpHeader `json:"headers,omitempty"`
}

type tlsOptions struct {
	ALPN              []string `json:"alpn,omitempty"`
	Versions          []string `json:"versions,omitempty"`
	DefaultSelfSigned *bool    `json:"default_self_signed,omitempty"`
}

type replayCache struct {
	PathPrefix  string `json:"path_prefix"`
	TTLSeconds  int    `json:"ttl_seconds"`
	Type        string `json:"type"`
	Name        string `json:"name"`
	AllowBypass bool   `json:"allow_bypass,omitempty"`
}

type httpOptions struct {
	Compress *bool `json:"compress,omitempty"`
	Response *struct {
		Headers  map[string]interface{} `json:"headers,omitempty"`
		Pristine *bool                  `json:"pristine,omitempty"`
	} `json:"response,omitempty"`
	H2Backend          *bool         `json:"h2_backend,omitempty"`
	IdleTimeout        *uint32       `json:"idle_timeout,omitempty"`
	HeadersReadTimeout *uint32       `json:"headers_read_timeout,omitempty"`
	ReplayCache        []replayCache `json:"replay_cache,omitempty"`
}

type machinePort struct {
	Port              *int         `json:"port,omitempty"`
	StartPort         *int         `json:"start_port,omitempty"`
	EndPort           *int         `json:"end_port,omitempty"`
	Handlers          []string     `json:"handlers,omitempty"`
	ForceHTTPS        bool         `json:"force_https,omitempty"`
	TLSOptions        *tlsOptions  `json:"tls_options,omitempty"`
	HTTPOptions       *httpOptions `json:"http_options,omitempty"`
	ProxyProtoOptions *struct {
		Version string `json:"version,omitempty"`
	} `json:"proxy_proto_options,omitempty"`
}

type concurrency struct {
	Type      string `json:"type,omitempty"`
	HardLimit int    `json:"hard_limit,omitempty"`
	SoftLimit int    `json:"soft_limit,omitempty"`
}

type machineService struct {
	Protocol                 string         `json:"protocol,omitempty"`
	InternalPort             int            `json:"internal_port,omitempty"`
	Autostop                 *autostop      `json:"autostop,omitempty"`
	Autostart                *bool          `json:"autostart,omitempty"`
	MinMachinesRunning       *int           `json:"min_machines_running,omitempty"`
	Ports                    []machinePort  `json:"ports,omitempty"`
	Checks                   []serviceCheck `json:"checks,omitempty"`
	Concurrency              *concurrency   `json:"concurrency,omitempty"`
	ForceInstanceKey         *string        `json:"force_instance_key"`
	ForceInstanceDescription *string        `json:"force_instance_description,omitempty"`
}

type machineMetrics struct {
	Port  int    `json:"port,omitempty"`
	Path  string `json:"path,omitempty"`
	Https bool   `json:"https,omitempty"`
}

type static struct {
	GuestPath     string `json:"guest_path"`
	UrlPrefix     string `json:"url_prefix"`
	TigrisBucket  string `json:"tigris_bucket"`
	IndexDocument string `json:"index_document"`
}

type file struct {
	GuestPath   string  `json:"guest_path,omitempty"`
	RawValue    *string `json:"raw_value,omitempty"`
	SecretName  *string `json:"secret_name,omitempty"`
	ImageConfig *string `json:"image_config,omitempty"`
	Mode        uint32  `json:"mode,omitempty"`
}

type machineRestart struct {
	Policy     string `json:"policy,omitempty"`
	MaxRetries int    `json:"max_retries,omitempty"`
}

type dnsConfig struct {
	SkipRegistration bool     `json:"skip_registration,omitempty"`
	Nameservers      []string `json:"nameservers,omitempty"`
	Searches         []string `json:"searches,omitempty"`
	Options          []struct {
		Name  string `json:"name,omitempty"`
		Value string `json:"value,omitempty"`
	} `json:"options,omitempty"`
	DNSForwardRules []struct {
		Basename string `json:"basename,omitempty"`
		Addr     string `json:"addr,omitempty"`
	} `json:"dns_forward_rules,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	HostnameFqdn string `json:"hostname_fqdn,omitempty"`
}

type machineSecret struct {
	EnvVar string `json:"env_var"`
	Name   string `json:"name"`
}

type envFrom struct {
	EnvVar   string `json:"env_var"`
	FieldRef string `json:"field_ref"`
}

type machineProcess struct {
	ExecOverride       []string          `json:"exec,omitempty"`
	EntrypointOverride []string          `json:"entrypoint,omitempty"`
	CmdOverride        []string          `json:"cmd,omitempty"`
	UserOverride       string            `json:"user,omitempty"`
	ExtraEnv           map[string]string `json:"env,omitempty"`
	Secrets            []machineSecret   `json:"secrets,omitempty"`
	IgnoreAppSecrets   bool              `json:"ignore_app_secrets,omitempty"`
	EnvFrom            []envFrom         `json:"env_from,omitempty"`
}

type stopConfig struct {
	Timeout *duration `json:"timeout,omitempty"`
	Signal  *string   `json:"signal,omitempty"`
}

type containerHealthcheck struct {
	Name             string `json:"name"`
	Interval         int64  `json:"interval,omitempty"`
	GracePeriod      int64  `json:"grace_period,omitempty"`
	SuccessThreshold int32  `json:"success_threshold,omitempty"`
	FailureThreshold int32  `json:"failure_threshold,omitempty"`
	Timeout          int64  `json:"timeout,omitempty"`
	Kind             string `json:"kind,omitempty"`
	Unhealthy        string `json:"unhealthy,omitempty"`
	HTTP             *struct {
		Port          int32        `json:"port"`
		Method        string       `json:"method,omitempty"`
		Path          string       `json:"path,omitempty"`
		Headers       []httpHeader `json:"headers,omitempty"`
		Scheme        string       `json:"scheme,omitempty"`
		TLSSkipVerify *bool        `json:"tls_skip_verify,omitempty"`
		TLSServerName string       `json:"tls_server_name,omitempty"`
	} `json:"http,omitempty"`
	TCP *struct {
		Port int32 `json:"port"`
	} `json:"tcp,omitempty"`
	Exec *struct {
		Command []string `json:"command"`
	} `json:"exec,omitempty"`
}

type containerConfig struct {
	Name               string            `json:"name"`
	Image              string            `json:"image"`
	ExecOverride       []string          `json:"exec,omitempty"`
	EntrypointOverride []string          `json:"entrypoint,omitempty"`
	CmdOverride        []string          `json:"cmd,omitempty"`
	UserOverride       string            `json:"user,omitempty"`
	ExtraEnv           map[string]string `json:"env,omitempty"`
	Secrets            []machineSecret   `json:"secrets,omitempty"`
	EnvFrom            []envFrom         `json:"env_from,omitempty"`
	Files              []*file           `json:"files,omitempty"`
	Restart            *machineRestart   `json:"restart,omitempty"`
	Stop               *stopConfig       `json:"stop,omitempty"`
	DependsOn          []struct {
		Name      string `json:"name"`
		Condition string `json:"condition"`
	} `json:"depends_on,omitempty"`
	Healthchecks []containerHealthcheck `json:"healthchecks,omitempty"`
	Mounts       []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	} `json:"mounts,omitempty"`
}

type volumeConfig struct {
	Name    string `json:"name"`
	TempDir *struct {
		StorageType string `json:"storage_type"`
		SizeMB      uint64 `json:"size_mb,omitempty"`
	} `json:"temp_dir,omitempty"`
	Image string `json:"image,omitempty"`
}

type machineConfig struct {
	Env         map[string]string       `json:"env,omitempty"`
	Init        machineInit             `json:"init"`
	Guest       *machineGuest           `json:"guest,omitempty"`
	Metadata    map[string]string       `json:"metadata,omitempty"`
	Mounts      []machineMount          `json:"mounts,omitempty"`
	Services    []machineService        `json:"services,omitempty"`
	Metrics     *machineMetrics         `json:"metrics,omitempty"`
	Checks      map[string]machineCheck `json:"checks,omitempty"`
	Statics     []*static               `json:"statics,omitempty"`
	Image       string                  `json:"image,omitempty"`
	Files       []*file                 `json:"files,omitempty"`
	Schedule    string                  `json:"schedule,omitempty"`
	AutoDestroy bool                    `json:"auto_destroy,omitempty"`
	Restart     *machineRestart         `json:"restart,omitempty"`
	DNS         *dnsConfig              `json:"dns,omitempty"`
	Processes   []machineProcess        `json:"processes,omitempty"`
	Standbys    []string                `json:"standbys,omitempty"`
	StopConfig  *stopConfig             `json:"stop_config,omitempty"`
	Containers  []*containerConfig      `json:"containers,omitempty"`
	Volumes     []*volumeConfig         `json:"volumes,omitempty"`
	Rootfs      *struct {
		Persist persistRootfs `json:"persist,omitempty"`
		SizeGB  uint64        `json:"size_gb,omitempty"`
	} `json:"rootfs,omitempty"`
	CacheDrive *struct {
		SizeMB uint64 `json:"size_mb,omitempty"`
	} `json:"cache_drive,omitempty"`
	Spot *struct {
		MaxPriceFraction float64 `json:"max_price_fraction,omitempty"`
	} `json:"spot,omitempty"`
	VMSize                  string `json:"size,omitempty"`
	DisableMachineAutostart *bool  `json:"disable_machine_autostart,omitempty"`
}

type machine struct {
	ID                string             `json:"id,omitempty"`
	Name              string             `json:"name,omitempty"`
	State             string             `json:"state,omitempty"`
	Region            string             `json:"region,omitempty"`
	ImageRef          imageRef           `json:"image_ref"`
	InstanceID        string             `json:"instance_id,omitempty"`
	Version           string             `json:"version,omitempty"`
	PrivateIP         string             `json:"private_ip,omitempty"`
	CreatedAt         string             `json:"created_at,omitempty"`
	UpdatedAt         string             `json:"updated_at,omitempty"`
	Config            *machineConfig     `json:"config,omitempty"`
	Events            []*machineEvent    `json:"events,omitempty"`
	Checks            []*checkStatus     `json:"checks,omitempty"`
	LeaseNonce        string             `json:"nonce,omitempty"`
	HostStatus        string             `json:"host_status,omitempty"`
	Cordoned          bool               `json:"cordoned"`
	ContainerStatuses []*containerStatus `json:"containers,omitempty"`
	IncompleteConfig  *machineConfig     `json:"incomplete_config,omitempty"`
}

type startResponse struct {
	Message       string `json:"message,omitempty"`
	Status        string `json:"status,omitempty"`
	PreviousState string `json:"previous_state,omitempty"`
}

type leaseData struct {
	Nonce     string `json:"nonce,omitempty"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	Owner     string `json:"owner,omitempty"`
	Version   string `json:"version,omitempty"`
}

type lease struct {
	Status  string     `json:"status,omitempty"`
	Data    *leaseData `json:"data,omitempty"`
	Message string     `json:"message,omitempty"`
	Code    string     `json:"code,omitempty"`
}

type execResponse struct {
	ExitCode int32  `json:"exit_code,omitempty"`
	StdOut   string `json:"stdout,omitempty"`
	StdErr   string `json:"stderr,omitempty"`
}

type processStat struct {
	Pid           int32  `json:"pid"`
	Stime         uint64 `json:"stime"`
	Rtime         uint64 `json:"rtime"`
	Command       string `json:"command"`
	Directory     string `json:"directory"`
	Cpu           uint64 `json:"cpu"`
	Rss           uint64 `json:"rss"`
	ListenSockets []struct {
		Proto   string `json:"proto"`
		Address string `json:"address"`
	} `json:"listen_sockets"`
}

type organization struct {
	Name              string `json:"name"`
	Slug              string `json:"slug"`
	InternalNumericID int32  `json:"internal_numeric_id"`
}

type app struct {
	ID                string       `json:"id"`
	Name              string       `json:"name"`
	InternalNumericID int32        `json:"internal_numeric_id"`
	Network           string       `json:"network"`
	Status            string       `json:"status"`
	MachineCount      int64        `json:"machine_count"`
	VolumeCount       int64        `json:"volume_count"`
	Organization      organization `json:"organization"`
	CnameTarget       string       `json:"cname_target"`
	AppRole           string       `json:"app_role"`
}

type appList struct {
	Apps []app `json:"apps"`
}

type appSecret struct {
	Name      string  `json:"name"`
	Value     *string `json:"value,omitempty"`
	Digest    string  `json:"digest,omitempty"`
	UpdatedAt *string `json:"updated_at,omitempty"`
	CreatedAt *string `json:"created_at,omitempty"`
}

type secretList struct {
	Secrets []appSecret `json:"secrets"`
}

type secretSet struct {
	appSecret
	Version uint64 `json:"version"`
}

type secretDelete struct {
	Version uint64 `json:"version"`
}

type secretsUpdate struct {
	Secrets []appSecret `json:"secrets"`
	Version uint64      `json:"version"`
}

type volume struct {
	ID                 string    `json:"id"`
	Name               string    `json:"name"`
	State              string    `json:"state"`
	SizeGb             int       `json:"size_gb"`
	Region             string    `json:"region"`
	Zone               string    `json:"zone"`
	Encrypted          bool      `json:"encrypted"`
	AttachedMachine    *string   `json:"attached_machine_id"`
	AttachedAllocation *string   `json:"attached_alloc_id"`
	CreatedAt          time.Time `json:"created_at"`
	HostDedicationID   string    `json:"host_dedication_id"`
	SnapshotRetention  int       `json:"snapshot_retention"`
	AutoBackupEnabled  bool      `json:"auto_backup_enabled"`
	HostStatus         string    `json:"host_status,omitempty"`
}

type extendVolumeResponse struct {
	Volume       *volume `json:"volume"`
	NeedsRestart bool    `json:"needs_restart"`
}

type volumeSnapshot struct {
	ID            string    `json:"id"`
	Size          int       `json:"size"`
	VolumeSize    int       `json:"volume_size"`
	Digest        string    `json:"digest"`
	CreatedAt     time.Time `json:"created_at"`
	Status        string    `json:"status"`
	RetentionDays *int      `json:"retention_days"`
}

// An error answer, as the client reads it for its message: {"error", "message"?}.
type flapsError struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

// An error answer, as the client reads it for its status code: {"error", "status"}.
type errorStatus struct {
	Error      string `json:"error"`
	StatusCode string `json:"status"`
}

var kinds = map[string]func() interface{}{
	"machine":        func() interface{} { return new(machine) },
	"machines":       func() interface{} { return &[]*machine{} },
	"start":          func() interface{} { return new(startResponse) },
	"lease":          func() interface{} { return new(lease) },
	"exec":           func() interface{} { return new(execResponse) },
	"ps":             func() interface{} { return &[]processStat{} },
	"metadata":       func() interface{} { return &map[string]string{} },
	"app":            func() interface{} { return new(app) },
	"apps":           func() interface{} { return new(appList) },
	"secrets":        func() interface{} { return new(secretList) },
	"secret":         func() interface{} { return new(appSecret) },
	"secret_set":     func() interface{} { return new(secretSet) },
	"secret_delete":  func() interface{} { return new(secretDelete) },
	"secrets_update": func() interface{} { return new(secretsUpdate) },
	"volume":         func() interface{} { return new(volume) },
	"volumes":        func() interface{} { return &[]volume{} },
	"volume_extend":  func() interface{} { return new(extendVolumeResponse) },
	"snapshots":      func() interface{} { return &[]volumeSnapshot{} },
	"flaps_error":    func() interface{} { return new(flapsError) },
	"error_status":   func() interface{} { return new(errorStatus) },
}

type input struct {
	Kind string `json:"kind"`
	Body string `json:"body"`
}

func main() {
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<26)
	for scanner.Scan() {
		var in input
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			fmt.Println("error: bad input:", err)
			continue
		}
		newOut, known := kinds[in.Kind]
		if !known {
			fmt.Printf("error: unknown kind %q\n", in.Kind)
			continue
		}
		out := newOut()
		var err error
		if in.Kind == "flaps_error" || in.Kind == "error_status" {
			err = json.Unmarshal([]byte(in.Body), out) // as the client reads an error body
		} else {
			err = json.NewDecoder(strings.NewReader(in.Body)).Decode(out)
		}
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		encoded, err := json.Marshal(out)
		if err != nil {
			fmt.Println("error: re-encoding:", err)
			continue
		}
		fmt.Println("ok", string(encoded))
	}
}
