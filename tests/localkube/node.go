package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"runtime"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const (
	nodeIP             = "127.0.0.1"
	nodeLeaseNamespace = "kube-node-lease"
	nodeLeaseSeconds   = 40
	nodeLeaseRenew     = 10 * time.Second
)

// kubeletVersion is what the fake node reports: the Kubernetes version
// build.sh stamps into the binary.
var kubeletVersion = version.Get().GitVersion

// fakeNode stands in for a scheduler and a kubelet on one Node: it binds every
// unscheduled pod to its Node, reports bound pods as started and Ready (pods
// with restartPolicy Never/OnFailure as Succeeded, so Jobs complete), and
// finishes the deletion of pods that are being deleted. Nothing runs.
type fakeNode struct {
	client kubernetes.Interface
	name   string
	pods   corelisters.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]
	// bindOnly: a real kubelet runs the pods (--real-node); only the
	// scheduler's part (binding) is done here.
	bindOnly bool
}

// register creates (or, after a restart, refreshes) the Node object: Ready,
// with capacity, and without the not-ready taint that admission puts on new
// nodes.
func (n *fakeNode) register(ctx context.Context) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("32"),
		corev1.ResourceMemory:           resource.MustParse("128Gi"),
		corev1.ResourcePods:             resource.MustParse("1000"),
		corev1.ResourceEphemeralStorage: resource.MustParse("500Gi"),
	}
	now := metav1.Now()
	status := corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "localkube fake node is ready", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: nodeIP},
			{Type: corev1.NodeHostName, Address: n.name},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               n.name,
			SystemUUID:              n.name,
			BootID:                  n.name,
			KernelVersion:           "localkube",
			OSImage:                 "localkube",
			ContainerRuntimeVersion: "localkube://" + kubeletVersion,
			KubeletVersion:          kubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}

	nodes := n.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: n.name,
				Labels: map[string]string{
					"kubernetes.io/hostname":           n.name,
					"kubernetes.io/os":                 "linux",
					"kubernetes.io/arch":               runtime.GOARCH,
					"localkube.windvane.dev/fake-node": "true",
				},
			},
			Status: status,
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("registering node %s: %w", n.name, err)
	}

	// Drop the taints that admission or the lifecycle controller put on a node
	// that has not (yet) reported Ready.
	var taints []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady && t.Key != corev1.TaintNodeUnreachable {
			taints = append(taints, t)
		}
	}
	if len(taints) != len(node.Spec.Taints) {
		node.Spec.Taints = taints
		if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("untainting node %s: %w", n.name, err)
		}
	}
	node.Status = status
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating status of node %s: %w", n.name, err)
	}
	return nil
}

// renewLease keeps the node's Lease fresh, which is the heartbeat the node
// lifecycle controller watches, until ctx is done.
func (n *fakeNode) renewLease(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := n.renewLeaseOnce(ctx); err != nil && ctx.Err() == nil {
			klog.Warningf("fake node: renewing lease: %v", err)
		}
	}, nodeLeaseRenew)
}

func (n *fakeNode) renewLeaseOnce(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases(nodeLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      n.name,
				Namespace: nodeLeaseNamespace,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(n.name),
				LeaseDurationSeconds: ptr.To[int32](nodeLeaseSeconds),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr.To(n.name)
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](nodeLeaseSeconds)
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// run watches pods and works on them until ctx is done. It returns once the
// pod cache has synced.
func (n *fakeNode) run(ctx context.Context, factory informers.SharedInformerFactory) error {
	informer := factory.Core().V1().Pods()
	n.pods = informer.Lister()
	n.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "localkube-fake-node"},
	)
	enqueue := func(obj interface{}) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			n.queue.Add(key)
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return fmt.Errorf("fake node: pod cache did not sync")
	}
	go func() {
		<-ctx.Done()
		n.queue.ShutDown()
	}()
	for i := 0; i < 4; i++ {
		go n.worker(ctx)
	}
	if !n.bindOnly {
		go n.renewLease(ctx)
	}
	return nil
}

func (n *fakeNode) worker(ctx context.Context) {
	for {
		key, quit := n.queue.Get()
		if quit {
			return
		}
		if err := n.sync(ctx, key); err != nil {
			if ctx.Err() == nil {
				klog.V(2).Infof("fake node: pod %s: %v (retrying)", key, err)
			}
			n.queue.AddRateLimited(key)
		} else {
			n.queue.Forget(key)
		}
		n.queue.Done(key)
	}
}

func (n *fakeNode) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := n.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pods := n.client.CoreV1().Pods(ns)
	if n.bindOnly && (pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil) {
		return nil
	}

	switch {
	case pod.DeletionTimestamp != nil:
		// The kubelet's part of a deletion: confirm the containers are gone.
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.name {
			return nil
		}
		err := pods.Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err

	case pod.Spec.NodeName == "":
		// The scheduler's part: there is one node, so bind to it.
		err := pods.Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: n.name},
		}, metav1.CreateOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or bound meanwhile: the next event tells
		}
		return err

	case pod.Spec.NodeName != n.name:
		return nil

	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	}

	// The kubelet's part: report the pod started.
	status := desiredPodStatus(pod)
	if apiequality.Semantic.DeepEqual(&pod.Status, status) {
		return nil
	}
	updated := pod.DeepCopy()
	updated.Status = *status
	_, err = pods.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// desiredPodStatus is the status a kubelet would report for pod once all its
// containers started: Running and Ready for pods that restart Always,
// Succeeded (all containers exited 0) for the others. Transition and start
// times already in the status are kept, so the result is stable.
func desiredPodStatus(pod *corev1.Pod) *corev1.PodStatus {
	status := pod.Status.DeepCopy()
	now := metav1.Now()
	completes := pod.Spec.RestartPolicy == corev1.RestartPolicyNever || pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure

	if status.StartTime == nil {
		status.StartTime = &now
	}
	status.ObservedGeneration = pod.Generation
	status.HostIP = nodeIP
	status.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	ip := podIP(pod)
	status.PodIP = ip
	status.PodIPs = []corev1.PodIP{{IP: ip}}

	startedAt := now
	initStatuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.InitContainers))
	for _, c := range pod.Spec.InitContainers {
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		cs := containerStatus(pod, c, findContainerStatus(status.InitContainerStatuses, c.Name), startedAt, sidecar && !completes)
		initStatuses = append(initStatuses, cs)
	}
	containerStatuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		cs := containerStatus(pod, c, findContainerStatus(status.ContainerStatuses, c.Name), startedAt, !completes)
		containerStatuses = append(containerStatuses, cs)
	}
	if len(initStatuses) > 0 {
		status.InitContainerStatuses = initStatuses
	} else {
		status.InitContainerStatuses = nil
	}
	status.ContainerStatuses = containerStatuses

	ready := corev1.ConditionTrue
	readyReason := ""
	containersReady := corev1.ConditionTrue
	containersReadyReason := ""
	if completes {
		status.Phase = corev1.PodSucceeded
		ready, readyReason = corev1.ConditionFalse, "PodCompleted"
		containersReady, containersReadyReason = corev1.ConditionFalse, "PodCompleted"
	} else {
		status.Phase = corev1.PodRunning
		for _, gate := range pod.Spec.ReadinessGates {
			c := findCondition(status.Conditions, gate.ConditionType)
			if c == nil || c.Status != corev1.ConditionTrue {
				ready, readyReason = corev1.ConditionFalse, "ReadinessGatesNotReady"
			}
		}
	}
	setCondition(status, corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", pod.Generation, now)
	setCondition(status, corev1.PodInitialized, corev1.ConditionTrue, "", pod.Generation, now)
	setCondition(status, corev1.ContainersReady, containersReady, containersReadyReason, pod.Generation, now)
	setCondition(status, corev1.PodReady, ready, readyReason, pod.Generation, now)
	setCondition(status, corev1.PodScheduled, corev1.ConditionTrue, "", pod.Generation, now)
	return status
}

func containerStatus(pod *corev1.Pod, c corev1.Container, old *corev1.ContainerStatus, startedAt metav1.Time, running bool) corev1.ContainerStatus {
	if old != nil {
		if old.State.Running != nil {
			startedAt = old.State.Running.StartedAt
		} else if old.State.Terminated != nil {
			startedAt = old.State.Terminated.StartedAt
		}
	}
	// Start from what is there, so fields set by others are kept.
	var cs corev1.ContainerStatus
	if old != nil {
		cs = *old.DeepCopy()
	}
	cs.Name = c.Name
	cs.Image = c.Image
	cs.ImageID = c.Image
	cs.ContainerID = fmt.Sprintf("localkube://%s/%s", pod.UID, c.Name)
	cs.RestartCount = 0
	cs.State = corev1.ContainerState{}
	cs.LastTerminationState = corev1.ContainerState{}
	if running {
		cs.Ready = true
		cs.Started = ptr.To(true)
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: startedAt}
	} else {
		finishedAt := startedAt
		if old != nil && old.State.Terminated != nil {
			finishedAt = old.State.Terminated.FinishedAt
		}
		cs.Ready = false
		cs.Started = ptr.To(false)
		cs.State.Terminated = &corev1.ContainerStateTerminated{
			ExitCode:    0,
			Reason:      "Completed",
			StartedAt:   startedAt,
			FinishedAt:  finishedAt,
			ContainerID: cs.ContainerID,
		}
	}
	return cs
}

func findContainerStatus(statuses []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range statuses {
		if statuses[i].Name == name {
			return &statuses[i]
		}
	}
	return nil
}

func findCondition(conds []corev1.PodCondition, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// setCondition sets a condition's status and reason, keeping its transition
// time when the status does not change.
func setCondition(status *corev1.PodStatus, t corev1.PodConditionType, s corev1.ConditionStatus, reason string, generation int64, now metav1.Time) {
	if c := findCondition(status.Conditions, t); c != nil {
		if c.Status != s {
			c.LastTransitionTime = now
		}
		c.Status = s
		c.Reason = reason
		c.Message = ""
		c.ObservedGeneration = generation
		return
	}
	status.Conditions = append(status.Conditions, corev1.PodCondition{
		Type:               t,
		Status:             s,
		Reason:             reason,
		LastTransitionTime: now,
		ObservedGeneration: generation,
	})
}

// podIP derives a stable address for a pod from its UID, in 10.64.0.0/10, so
// restarts and re-syncs give the same answer without bookkeeping. Host network
// pods get the node's address.
func podIP(pod *corev1.Pod) string {
	if pod.Spec.HostNetwork {
		return nodeIP
	}
	h := fnv.New32a()
	h.Write([]byte(pod.UID))
	offset := h.Sum32() % (1 << 22)
	switch offset & 0xff {
	case 0:
		offset++
	case 0xff:
		offset--
	}
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, (10<<24|64<<16)+offset)
	return ip.String()
}
