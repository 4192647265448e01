#!/bin/sh
# The POSIX ACL matrix: run from the root of a filesystem (as root), once on
# a jext4 FUSE mount and once on a kernel ext4 mount of an identical image;
# the two transcripts must be identical (tests/acl_kernel.rs compares them).
# Every case prints a header, then what each step printed and its exit
# status; `stat` and `getfacl -n` show resulting modes and ACLs.
#
# Users (numeric: no /etc/passwd entries needed):
#   alice 2001, group 3001          bob   2002, group 3002, also in 3003
#   carol 2003, group 3003          dave  2004, group 3004, also in 3001
set -u
cd "$1" || exit 1

case_() { printf '\n== %s\n' "$*"; }

# as USER UMASK COMMANDS: run COMMANDS with sh as USER under UMASK.
as() {
    who=$1 mask=$2
    shift 2
    case $who in
    alice) ids="--reuid=2001 --regid=3001 --clear-groups" ;;
    bob) ids="--reuid=2002 --regid=3002 --groups=3003" ;;
    carol) ids="--reuid=2003 --regid=3003 --clear-groups" ;;
    dave) ids="--reuid=2004 --regid=3004 --groups=3001" ;;
    root) ids="--reuid=0 --regid=0 --clear-groups" ;;
    esac
    # shellcheck disable=SC2086
    setpriv $ids sh -c "umask $mask; $*" 2>&1
    printf -- '-> %s %s: %s\n' "$who" "$*" "$?"
}

# access USER PATH...: which of r, w, x access(2) grants USER.
access() {
    who=$1
    shift
    for path in "$@"; do
        as "$who" 022 "for p in r w x; do test -\$p '$path' && printf %s \$p || printf -; done; echo"
    done
}

show() {
    for path in "$@"; do
        stat -c '%n %A %a %u:%g %s' "$path" 2>&1
        getfacl -n "$path" 2>&1 | grep -v '^$'
        getfattr -h -d -m - -e hex "$path" 2>/dev/null | grep -v '^#' | grep -v '^$' || true
    done
}

mkdir -m 0777 work && cd work || exit 1

case_ named user entries against the mode
as alice 022 'echo secret > deny; chmod 0644 deny; setfacl -m u:2002:--- deny'
as alice 022 'echo shared > allow; chmod 0600 allow; setfacl -m u:2002:r allow'
show deny allow
as bob 022 'cat deny'
as carol 022 'cat deny'
as bob 022 'cat allow'
as bob 022 'echo more >> allow'
as carol 022 'cat allow'
access bob deny allow
access carol deny allow

case_ named groups, supplementary groups and deny entries
as alice 022 'echo g > grp; chmod 0604 grp; setfacl -m g:3003:rw grp'
as alice 022 'echo d > gdeny; chmod 0666 gdeny; setfacl -m g:3001:--- gdeny'
show grp gdeny
as bob 022 'echo bob >> grp'
as carol 022 'echo carol >> grp'
as dave 022 'echo dave >> grp'
as dave 022 'cat gdeny'
as alice 022 'cat gdeny'
as carol 022 'cat gdeny'
access bob grp gdeny
access dave grp gdeny

case_ the owner entry and the owning group
as alice 022 'echo own > own; chmod 0077 own'
as alice 022 'cat own'
as dave 022 'cat own'
as alice 022 'echo o2 > owngrp; chmod 0640 owngrp; setfacl -m g::---,u:2004:r owngrp'
show own owngrp
as dave 022 'cat owngrp'
access alice own owngrp
access dave own owngrp

case_ the mask limits named entries and the owning group
as alice 022 'echo m > masked; setfacl -m u:2002:rwx,g:3003:rwx,m::r masked'
show masked
as bob 022 'cat masked'
as bob 022 'echo x >> masked'
as carol 022 'echo x >> masked'
as alice 022 'setfacl -m m::rw masked'
as bob 022 'echo x >> masked'
show masked

case_ chmod after setfacl moves the mask, not the group entry
as alice 022 'echo c > chm; setfacl -m u:2002:rw,g::r chm; chmod 0640 chm'
show chm
as bob 022 'echo x >> chm'
as alice 022 'chmod 0660 chm'
show chm
as bob 022 'echo x >> chm'
as alice 022 'chmod 0604 chm'
show chm
as bob 022 'cat chm'
as carol 022 'cat chm'

case_ setfacl sets the mode, and a minimal ACL is only a mode
as alice 022 'echo s > setm; chmod 0600 setm; setfacl -m g::rwx,o::r setm'
show setm
as alice 022 'setfacl -m u:2003:rw setm'
show setm
as alice 022 'setfacl -b setm'
show setm
as alice 022 'setfacl --set u::rw,g::r,o::- setm'
show setm

case_ only the owner may set ACLs, default ACLs only on directories
as bob 022 'setfacl -m u:2002:rwx deny'
as alice 022 'setfacl -d -m u:2002:rwx deny'
as alice 022 'setfattr -x system.posix_acl_access setm'
as alice 022 'setfattr -x system.posix_acl_default setm'
show deny setm

case_ directories: search and listing through ACL entries
as alice 022 'mkdir dir; echo inside > dir/file; chmod 0700 dir; setfacl -m u:2002:x,u:2003:r dir'
show dir
as bob 022 'cat dir/file'
as bob 022 'ls dir'
as carol 022 'ls dir'
as carol 022 'cat dir/file'
as dave 022 'cat dir/file'
as alice 022 'setfacl -m u:2002:wx dir'
as bob 022 'echo bob > dir/bobs; rm dir/file'
show dir dir/bobs

case_ default ACLs inherited two levels deep
as alice 022 'mkdir top; setfacl -m u:2002:rwx top; setfacl -d -m u:2002:rwx,g:3003:rx,o::- top'
as alice 077 'mkdir top/mid'
as alice 022 'mkdir -m 0750 top/mid/low'
as alice 022 'touch top/file top/mid/file top/mid/low/file'
as bob 022 'touch top/mid/bobs; mkdir top/mid/bobdir'
as alice 022 'mkfifo -m 0666 top/mid/fifo'
as alice 022 'ln -s file top/mid/link'
show top top/mid top/mid/low top/file top/mid/file top/mid/low/file top/mid/bobs top/mid/bobdir top/mid/fifo top/mid/link
as carol 022 'cat top/mid/file'
as carol 022 'touch top/mid/carols'
as dave 022 'ls top'
access bob top/mid/low top/mid/low/file
access carol top/mid top/mid/low/file

case_ the umask with and without a default ACL
as alice 022 'mkdir plain acl; setfacl -d -m u::rwx,g::rwx,o::rwx acl; setfacl -d -m u:2003:r acl'
for mask in 000 022 027 077 777; do
    as alice $mask "touch plain/f$mask acl/f$mask; mkdir plain/d$mask acl/d$mask; mkfifo plain/p$mask acl/p$mask"
done
show plain/f000 plain/f022 plain/f027 plain/f077 plain/f777 plain/d027 plain/p077
show acl/f000 acl/f022 acl/f027 acl/f077 acl/f777 acl/d027 acl/d777 acl/p077
as alice 022 'setfacl -d --set u::rw,g::r,o::- acl'
as alice 077 'touch acl/minimal; mkdir acl/minimaldir'
show acl acl/minimal acl/minimaldir

case_ setgid directories
mkdir sgid && chown 2001:3003 sgid && chmod 2775 sgid
as alice 022 'setfacl -d -m u:2002:rwx sgid'
as alice 022 'touch sgid/a; mkdir sgid/sub; mkdir sgid/sub/deeper'
as dave 022 'touch sgid/d' # not allowed: dave is other
as carol 022 'touch sgid/c; mkdir sgid/csub'
as bob 022 'touch sgid/b'
show sgid sgid/a sgid/sub sgid/sub/deeper sgid/c sgid/csub sgid/b
as alice 022 'touch sgid/exec; chmod 2755 sgid/exec'
show sgid/exec
as carol 022 'touch sgid/cexec; chmod 2775 sgid/cexec'
show sgid/cexec

case_ a new file asking for setgid in a setgid directory
setfacl -m u:2004:rwx sgid
for who in alice dave; do
    as $who 022 "python3 -c 'import os; os.close(os.open(\"sgid/$who-sgid\", os.O_CREAT | os.O_WRONLY, 0o2775)); os.mkdir(\"sgid/$who-dir\", 0o2775)'"
done
show sgid/alice-sgid sgid/dave-sgid sgid/alice-dir sgid/dave-dir
as dave 022 'touch sgid/dave-chmod; chmod 2775 sgid/dave-chmod'
show sgid/dave-chmod

case_ setfacl clears setgid unless the caller is in the group
mkdir setgidfiles
# chown before chmod: chown clears a group-executable setgid bit.
for name in member stranger; do
    echo x > setgidfiles/$name
    chown 2001:3003 setgidfiles/$name
done
chown 2003:3003 setgidfiles/member
chmod 2775 setgidfiles/member setgidfiles/stranger
show setgidfiles/member setgidfiles/stranger
as carol 022 'setfacl -m u:2002:r setgidfiles/member'
as alice 022 'setfacl -m u:2002:r setgidfiles/stranger'
show setgidfiles/member setgidfiles/stranger
echo x > setgidfiles/rootset && chown 2001:3003 setgidfiles/rootset && chmod 2775 setgidfiles/rootset
setfacl -m u:2002:r setgidfiles/rootset
show setgidfiles/rootset
as alice 022 'chmod 2770 setgidfiles/stranger'
show setgidfiles/stranger

case_ chown keeps the ACL, chgrp by the owner
as alice 022 'echo c > chowned; setfacl -m u:2002:rw,g:3003:r chowned'
chown 2003:3003 chowned
show chowned
as carol 022 'chgrp 3001 chowned'
as alice 022 'chgrp 3001 deny'
show chowned deny

case_ rename, hard links and copies keep ACLs
as alice 022 'mv masked moved; ln moved linked; cp -p moved copied; cp moved plaincopy'
show moved linked copied plaincopy
as bob 022 'echo x >> linked'
as bob 022 'echo x >> copied'

case_ access ACLs on the directory of the matrix
setfacl -m u:2004:rwx,m::rx .
show .
as dave 022 'touch dave-was-here'
setfacl -b .

case_ final tree
cd ..
find work -mindepth 1 | sort | while read -r path; do
    stat -c '%n %a %u:%g %h' "$path"
done
getfacl -R -n -P work 2>&1
